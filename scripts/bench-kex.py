#!/usr/bin/env python3
"""Python `cryptography` side of `make bench-kex`: X-Wing keygen (from a seed), encaps, decaps
composed from its ML-KEM-768, X25519 and hashlib's SHA-3 (as a Python user would), and one HPKE
export (LabeledExpand on its HKDF; its HPKE API has no export). Same operations as
`kex-tool bench`. Prints one JSON object of operations per second."""
import hashlib
import json
import os
import sys
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import mlkem, x25519
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

LABEL = b"\\.//^\\"


def keygen(seed):
    e = hashlib.shake_256(seed).digest(96)
    m = mlkem.MLKEM768PrivateKey.from_seed_bytes(e[:64])
    x = x25519.X25519PrivateKey.from_private_bytes(e[64:])
    return m, x, m.public_key().public_bytes_raw() + x.public_key().public_bytes_raw()


def encaps(pk):
    pk_m = mlkem.MLKEM768PublicKey.from_public_bytes(pk[:1184])
    pk_x = pk[1184:]
    ek = x25519.X25519PrivateKey.generate()
    ct_x = ek.public_key().public_bytes_raw()
    ss_x = ek.exchange(x25519.X25519PublicKey.from_public_bytes(pk_x))
    ss_m, ct_m = pk_m.encapsulate()
    return hashlib.sha3_256(ss_m + ss_x + ct_x + pk_x + LABEL).digest(), ct_m + ct_x


def decaps(m, x, pk, ct):
    ss_m = m.decapsulate(ct[:1088])
    ct_x = ct[1088:]
    ss_x = x.exchange(x25519.X25519PublicKey.from_public_bytes(ct_x))
    return hashlib.sha3_256(ss_m + ss_x + ct_x + pk[1184:] + LABEL).digest()


def export(exporter_secret, context):
    suite = b"HPKE\x64\x7a\x00\x01\x00\x02"
    info = (32).to_bytes(2, "big") + b"HPKE-v1" + suite + b"sec" + context
    return HKDFExpand(hashes.SHA256(), 32, info).derive(exporter_secret)


def rate(body, seconds):
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            body()
        n += 10
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2
    seed = bytes([0x42]) * 32
    m, x, pk = keygen(seed)
    _, ct = encaps(pk)
    secret = os.urandom(32)
    context = b"AccessoryInternetKey-AccessoryToHost-x"
    print(json.dumps({
        "xwingKeygen": int(rate(lambda: keygen(seed), seconds)),
        "xwingEncaps": int(rate(lambda: encaps(pk), seconds)),
        "xwingDecaps": int(rate(lambda: decaps(m, x, pk, ct), seconds)),
        "hpkeExport": int(rate(lambda: export(secret, context), seconds)),
    }))


if __name__ == "__main__":
    main()
