#!/usr/bin/env python3
"""Seeds a fuzz corpus from the real Apple samples (read from ../shared, written only to the
scratch corpus). usage: fuzz-seeds.py cbor|assertion|receipt CORPUS_DIR SAMPLES_DIR
  cbor:      every attestation and assertion object, and each authenticator data's bytes after
             its fixed part (the iOS 27 / macOS 27 extension map, when there is one);
  assertion: every assertion object, after the fuzzer's 4-byte previous counter (0);
  receipt:   every receipt (the attestations' own and the refreshed ones), after the fuzzer's
             mode byte 1, and each one's payload (openssl cms) after mode byte 0."""
import base64, glob, json, os, subprocess, sys

kind, corpus, samples = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(corpus, exist_ok=True)

def cbor_bytes_field(data, key):
    """The byte string stored under a text key in a CBOR map (enough for App Attest objects)."""
    marker = bytes([0x60 + len(key)]) + key.encode()
    i = data.find(marker)
    if i < 0:
        return None
    i += len(marker)
    head = data[i]
    if head & 0xe0 != 0x40:
        return None
    info = head & 0x1f
    if info < 24:
        return data[i + 1:i + 1 + info]
    width = {24: 1, 25: 2, 26: 4}.get(info)
    if width is None:
        return None
    n = int.from_bytes(data[i + 1:i + 1 + width], 'big')
    return data[i + 1 + width:i + 1 + width + n]

def receipt_seeds(name, receipts):
    global count
    for n, receipt in enumerate(receipts):
        open(os.path.join(corpus, f'{name}-receipt{n}'), 'wb').write(b'\x01' + receipt)
        payload = subprocess.run(['openssl', 'cms', '-verify', '-noverify', '-binary', '-inform', 'DER'],
                                 input=receipt, capture_output=True).stdout
        if payload:
            open(os.path.join(corpus, f'{name}-payload{n}'), 'wb').write(b'\x00' + payload)
        count += 2

count = 0
for path in sorted(glob.glob(os.path.join(samples, '*.json')) + glob.glob(os.path.join(samples, '2026', '*.json'))):
    sample = json.load(open(path))
    name = os.path.basename(path)[:-5]
    objects = []
    if sample.get('attestation'):
        objects.append(('attestation', base64.b64decode(sample['attestation']['object'])))
    for n, assertion in enumerate(sample.get('assertions') or []):
        objects.append((f'assertion{n}', base64.b64decode(assertion['object'])))
    if kind == 'receipt':
        receipts = [base64.b64decode(r['object']) for r in sample.get('receipts') or []]
        if sample.get('attestation'):
            own = cbor_bytes_field(base64.b64decode(sample['attestation']['object']), 'receipt')
            if own and own not in receipts:
                receipts.append(own)
        receipt_seeds(name, receipts)
        continue
    for label, obj in objects:
        if kind == 'assertion':
            if label.startswith('assertion'):
                open(os.path.join(corpus, f'{name}-{label}'), 'wb').write(b'\0\0\0\0' + obj)
                count += 1
            continue
        open(os.path.join(corpus, f'{name}-{label}.cbor'), 'wb').write(obj)
        count += 1
        auth = cbor_bytes_field(obj, 'authData' if label == 'attestation' else 'authenticatorData')
        if auth and label.startswith('assertion') and len(auth) > 37:
            open(os.path.join(corpus, f'{name}-{label}-map.cbor'), 'wb').write(auth[37:])
            count += 1
print(f'fuzz-seeds: {count} seeds from {samples} in {corpus}')
