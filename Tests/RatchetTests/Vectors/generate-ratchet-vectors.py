#!/usr/bin/env python3
"""Generates ratchet-vectors.json ONCE; the file is then frozen and checked in.

Every ratchet step here is computed by the `openssl kdf` command line (HKDF, EXPAND_ONLY),
never by our Swift code, and re-checked with pyca/cryptography's HKDFExpand, so the frozen
vectors are an independent reference for Sources/Ratchet. Re-running it must reproduce the
checked-in file byte for byte (the inputs below are fixed); the Swift tests load the file.
"""
import hashlib, json, subprocess, sys
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

PREFIX = b"AccessoryTransportSecurity-RatchetKeys-"

def info(index):
    return PREFIX + index.to_bytes(4, "little")

def step_openssl(chain_key, index):
    out = subprocess.run(["openssl", "kdf", "-keylen", "64", "-kdfopt", "digest:SHA256",
                          "-kdfopt", "mode:EXPAND_ONLY", "-kdfopt", "hexkey:" + chain_key.hex(),
                          "-kdfopt", "hexinfo:" + info(index).hex(), "HKDF"],
                         check=True, capture_output=True, text=True).stdout
    okm = bytes.fromhex(out.strip().replace(":", ""))
    check = HKDFExpand(hashes.SHA256(), 64, info(index)).derive(chain_key)
    assert okm == check, "openssl kdf and pyca disagree"
    return okm[:32], okm[32:]

def chain(root, count):
    steps, key = [], root
    for i in range(count):
        mk, nck = step_openssl(key, i)
        steps.append({"index": i, "chainKey": key.hex(), "info": info(i).hex(),
                      "messageKey": mk.hex(), "nextChainKey": nck.hex()})
        key = nck
    return steps

def body(n, s, a, text):
    out = b""
    for f in [n, s, a] + ([text] if text is not None else []):
        b = f.encode()
        out += len(b).to_bytes(2, "big") + b
    return out

root_a = bytes(range(32))                                   # 00 01 .. 1f
root_b = bytes.fromhex("c0ffee" * 10 + "ab12")              # an arbitrary fixed pattern
single_key = bytes.fromhex("ff" * 32)
singles = []
for idx in [0, 1, 255, 256, 0x01020304, 50_000, 0x7fffffff, 0xfffffffe, 0xffffffff]:
    mk, nck = step_openssl(single_key, idx)
    singles.append({"chainKey": single_key.hex(), "index": idx, "info": info(idx).hex(),
                    "messageKey": mk.hex(), "nextChainKey": nck.hex()})

# A complete accessory response: message 2 of chain B, fixed nonce, Apple's example fields.
chain_b = chain(root_b, 5)
pub = bytes(range(64))                                       # a P-256 raw public key's shape (64 bytes)
kid = hashlib.sha384(pub).digest()[:4]
plain = body("notification-42", "com.example.chat", "reply", "On my way \u2713")
nonce = bytes.fromhex("000102030405060708090a0b")
msg_key = bytes.fromhex(chain_b[2]["messageKey"])
sealed = nonce + AESGCM(msg_key).encrypt(nonce, plain, None)
wire = kid + (2).to_bytes(4, "little") + sealed

doc = {
    "description": "Frozen Symmetric Key Ratchet vectors (hex, lowercase). step(chainKey, index) = HKDF-SHA256-Expand(PRK=chainKey, info='AccessoryTransportSecurity-RatchetKeys-' || LE32(index), L=64); messageKey = okm[0:32], nextChainKey = okm[32:64]. Generated once by generate-ratchet-vectors.py with the `openssl kdf` command line and pyca/cryptography; never regenerate them from the Swift code under test.",
    "chains": [
        {"name": "root 000102..1f", "rootKey": root_a.hex(), "steps": chain(root_a, 8)},
        {"name": "root c0ffee..ab12", "rootKey": root_b.hex(), "steps": chain_b},
    ],
    "singleSteps": singles,
    "keyIDs": [
        {"publicKey": pub.hex(), "sha384": hashlib.sha384(pub).hexdigest(), "keyID": kid.hex()},
        {"publicKey": "04" + "11" * 64, "sha384": hashlib.sha384(bytes.fromhex("04" + "11" * 64)).hexdigest(),
         "keyID": hashlib.sha384(bytes.fromhex("04" + "11" * 64)).digest()[:4].hex()},
    ],
    "response": {
        "notificationIdentifier": "notification-42", "sourceIdentifier": "com.example.chat",
        "actionIdentifier": "reply", "userText": "On my way \u2713",
        "body": plain.hex(), "rootKey": root_b.hex(), "messageIndex": 2, "messageKey": msg_key.hex(),
        "nonce": nonce.hex(), "sealed": sealed.hex(), "publicKey": pub.hex(), "keyID": kid.hex(),
        "internetMessage": wire.hex(),
    },
}
json.dump(doc, sys.stdout, indent=2, ensure_ascii=False)
sys.stdout.write("\n")
