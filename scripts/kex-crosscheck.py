#!/usr/bin/env python3
"""Cross-checks Sources/KeyExchange against Python `cryptography` (OpenSSL's ML-KEM, X25519,
P-256 and HPKE) on random keys: KEX_CROSSCHECK_N cases per ciphersuite (default 1000).

Per case, with the accessory key made from random bytes on both sides:
  - the public key Swift derives equals Python's (X-Wing: SHAKE256(seed, 96) -> ML-KEM-768 from
    d || z and X25519; P-256: the scalar's point, x || y);
  - Python's single-shot HPKE message (iPhone -> accessory, info = protocolInfo) opens in Swift;
  - Swift's HPKE message to the same key opens in Python;
  - both internet ratchet roots Swift exports equal the ones Python computes from Swift's
    encapsulated key (Python decapsulates with its own ML-KEM/X25519/ECDH, then runs the
    RFC 9180 key schedule on `cryptography`'s HKDF: its HPKE API has no export);
  - keyID = SHA-384(public key raw)[0:4] (hashlib).
Usage: kex-crosscheck.py KEX_TOOL   (exit 0 all agree, 1 on a disagreement)."""
import hashlib
import json
import os
import subprocess
import sys
import uuid

import cryptography
from cryptography.hazmat.backends.openssl import backend
from cryptography.hazmat.primitives import hashes, hmac, serialization
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric import ec, mlkem, x25519
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

LABEL = b"\\.//^\\"  # the 6 bytes 5c 2e 2f 2f 5e 5c
assert LABEL.hex() == "5c2e2f2f5e5c"


def extract(salt, ikm):
    h = hmac.HMAC(salt or bytes(32), hashes.SHA256())
    h.update(ikm)
    return h.finalize()


def expand(prk, info, length):
    return HKDFExpand(hashes.SHA256(), length, info).derive(prk)


def labeled_extract(suite, salt, label, ikm):
    return extract(salt, b"HPKE-v1" + suite + label + ikm)


def labeled_expand(suite, prk, label, info, length):
    return expand(prk, length.to_bytes(2, "big") + b"HPKE-v1" + suite + label + info, length)


class XWingKey:
    kem_id = 0x647A
    hpke_kem = hpke.KEM.MLKEM768_X25519

    def __init__(self, seed):
        expanded = hashlib.shake_256(seed).digest(96)
        self.m = mlkem.MLKEM768PrivateKey.from_seed_bytes(expanded[:64])
        self.x = x25519.X25519PrivateKey.from_private_bytes(expanded[64:])
        self.public = self.m.public_key().public_bytes_raw() + self.x.public_key().public_bytes_raw()
        self.hpke_private = hpke.MLKEM768X25519PrivateKey(self.m, self.x)
        self.hpke_public = self.hpke_private.public_key()
        self.enc_length = 1120

    def decapsulate(self, enc):
        ss_m = self.m.decapsulate(enc[:1088])
        ct_x = enc[1088:]
        ss_x = self.x.exchange(x25519.X25519PublicKey.from_public_bytes(ct_x))
        return hashlib.sha3_256(ss_m + ss_x + ct_x + self.public[1184:] + LABEL).digest()


class P256Key:
    kem_id = 0x0010
    hpke_kem = hpke.KEM.P256

    def __init__(self, raw):
        self.key = ec.derive_private_key(int.from_bytes(raw, "big"), ec.SECP256R1())
        self.x963 = self.key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        self.public = self.x963[1:]  # CryptoKit's rawRepresentation: x || y
        self.hpke_private = self.key
        self.hpke_public = self.key.public_key()
        self.enc_length = 65

    def decapsulate(self, enc):
        peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), enc)
        dh = self.key.exchange(ec.ECDH(), peer)
        suite = b"KEM" + self.kem_id.to_bytes(2, "big")
        prk = labeled_extract(suite, b"", b"eae_prk", dh)
        return labeled_expand(suite, prk, b"shared_secret", enc + self.x963, 32)


def exporter_secret(kem_id, shared_secret, info):
    suite = b"HPKE" + kem_id.to_bytes(2, "big") + b"\x00\x01\x00\x02"
    ksc = b"\x00" + labeled_extract(suite, b"", b"psk_id_hash", b"") + labeled_extract(suite, b"", b"info_hash", info)
    secret = labeled_extract(suite, shared_secret, b"secret", b"")
    return suite, labeled_expand(suite, secret, b"exp", ksc, 32)


def main():
    tool = sys.argv[1]
    n = int(os.environ.get("KEX_CROSSCHECK_N", "1000"))
    cases, keys = [], []
    for suite in ("xwing", "p256"):
        for _ in range(n):
            if suite == "xwing":
                private = os.urandom(32)
                key = XWingKey(private)
            else:
                private = ec.generate_private_key(ec.SECP256R1()).private_numbers().private_value.to_bytes(32, "big")
                key = P256Key(private)
            device, bluetooth = str(uuid.uuid4()).upper(), str(uuid.uuid4()).upper()
            info = f"{'XWing' if suite == 'xwing' else 'P256'}-v1-{device}".encode()
            plaintext = os.urandom(os.urandom(1)[0] % 65)
            hsuite = hpke.Suite(key.hpke_kem, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
            message = hsuite.encrypt(plaintext, key.hpke_public, info=info)
            cases.append({"suite": suite, "private": private.hex(), "device": device, "bluetooth": bluetooth,
                          "plaintext": plaintext.hex(), "pythonMessage": message.hex()})
            keys.append((key, hsuite, info, plaintext, bluetooth))
    run = subprocess.run([tool, "crosscheck"], input=json.dumps(cases).encode(), capture_output=True, check=False)
    if run.returncode != 0:
        print(f"kex-crosscheck: {tool} failed: {run.stderr.decode()}", file=sys.stderr)
        return 1
    answers = json.loads(run.stdout)
    failures = {}
    agreed = {"xwing": 0, "p256": 0}

    def bad(i, what):
        failures.setdefault(what, []).append(i)

    for i, (case, answer, (key, hsuite, info, plaintext, bluetooth)) in enumerate(zip(cases, answers, keys)):
        before = sum(len(v) for v in failures.values())
        if "error" in answer:
            bad(i, "swift error: " + answer["error"])
            continue
        if answer["public"] != key.public.hex():
            bad(i, "public key")
        if answer["keyID"] != hashlib.sha384(key.public).digest()[:4].hex():
            bad(i, "keyID")
        if answer["pythonPlaintext"] != case["plaintext"]:
            bad(i, "Swift opening Python's HPKE message")
        swift_message = bytes.fromhex(answer["swiftMessage"])
        try:
            if hsuite.decrypt(swift_message, key.hpke_private, info=info) != plaintext:
                bad(i, "Python opening Swift's HPKE message (plaintext)")
        except Exception:
            bad(i, "Python opening Swift's HPKE message")
        enc = swift_message[:key.enc_length]
        suite_id, exp = exporter_secret(key.kem_id, key.decapsulate(enc), info)
        for direction, field in (("AccessoryToHost", "swiftRootAccessoryToHost"), ("HostToAccessory", "swiftRootHostToAccessory")):
            context = f"AccessoryInternetKey-{direction}-{bluetooth}".encode()
            if labeled_expand(suite_id, exp, b"sec", context, 32).hex() != answer[field]:
                bad(i, f"{direction} root")
        if not answer["swiftRootsAgree"]:
            bad(i, "Swift sender and recipient roots")
        if sum(len(v) for v in failures.values()) == before:
            agreed[case["suite"]] += 1
    print(f"kex-crosscheck: agreed on {agreed['xwing']}/{n} X-Wing and {agreed['p256']}/{n} P-256 random keys "
          f"(cryptography {cryptography.__version__}, {backend.openssl_version_text()})")
    for what, idx in failures.items():
        print(f"  DISAGREE {what}: {len(idx)} cases, first {idx[:5]}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
