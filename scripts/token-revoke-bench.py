#!/usr/bin/env python3
"""The statement each mint runs to revoke a device's older live tokens, timed on the migrated
SQLite schema (Migrations/sqlite, all of them) with one device that minted N tokens, all but the
newest two revoked: with only the full token index (migrations up to 0008) and with the partial
live-token index of 0009. usage: scripts/token-revoke-bench.py [N=20000] [ROUNDS=200]"""
import glob, os, sqlite3, sys, time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 200
root = os.path.join(os.path.dirname(__file__), '..', 'Migrations', 'sqlite')
db = sqlite3.connect(':memory:')
for path in sorted(glob.glob(os.path.join(root, '*.sql'))):
    if not path.endswith('0009_live_tokens_index.sql'):
        db.executescript(open(path).read())
key, client = os.urandom(32), 'clid_bench'
db.executemany('INSERT INTO tokens (token_hash, client_id, workspace_id, key_id, issued_at, expires_at, revoked_at, grant_type) '
               'VALUES (?, ?, 1, ?, ?, ?, ?, ?)',
               [(os.urandom(32), client, key, 1000.0 + i, 4600.0 + i, None if i >= n - 2 else 1001.0 + i, 'assertion') for i in range(n)])
revoke = ('UPDATE tokens SET revoked_at = ? WHERE key_id = ? AND client_id = ? AND revoked_at IS NULL AND token_hash != ? '
          'AND token_hash NOT IN (SELECT token_hash FROM tokens WHERE key_id = ? AND client_id = ? AND revoked_at IS NULL '
          'AND token_hash != ? ORDER BY issued_at DESC LIMIT 1)')
args = (5.0, key, client, b'new', key, client, b'new')

def measure(label):
    plan = '; '.join(row[3] for row in db.execute('EXPLAIN QUERY PLAN ' + revoke, args))
    start = time.perf_counter()
    for _ in range(rounds):
        db.execute(revoke, args)
    print(f'{label}: {(time.perf_counter() - start) / rounds * 1e6:.1f} us per mint ({plan})')

measure(f'{n} tokens, full index only')
db.executescript(open(os.path.join(root, '0009_live_tokens_index.sql')).read())
measure(f'{n} tokens, with 0009')
