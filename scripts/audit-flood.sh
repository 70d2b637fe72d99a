#!/usr/bin/env bash
# Junk device requests from one address against the audit log, beside real exchanges: attestd
# (release build) with 64 simulated devices refreshing tokens (attest-sim load), once alone and once
# while one address sends FLOOD junk requests (challenges for client IDs with no integration,
# registrations and token requests with random keys and proofs) pipelined on 8 keep-alive
# connections from 127.0.0.2. Prints the audit rows and bytes the flood added and the exchange p99 of both runs,
# in ROUNDS interleaved pairs (a failed run is reported FAILED, never as a figure).
#
#   scripts/audit-flood.sh [FLOOD=100000] [ROUNDS=3] [SECONDS_PER_RUN=8]
#   BIN=/path/to/other/build/release scripts/audit-flood.sh …   # another build (its audit log as it was)
set -euo pipefail
cd "$(dirname "$0")/.."
flood=${1:-100000} rounds=${2:-3} seconds=${3:-8}
bin=${BIN:-.build/release}
[ -x $bin/attestd ] || swift build -c release >/dev/null
work=$(mktemp -d /tmp/audit-flood.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() {  # run LABEL FLOOD_COUNT: a fresh database, the load, and the flood beside it when asked
  local db="$work/$1.sqlite" port
  rm -f "$db"*
  $bin/attestctl init --db "$db" --owner bench@example.com >/dev/null
  local clid
  clid=$($bin/attestctl integrations create --db "$db" --actor bench@example.com --name Bench --team-id ABCDE12345 \
    --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
  port=$(free_port)
  $bin/attestd serve --db "$db" --listen "127.0.0.1:$port" --admin-listen none --trust-anchor Fixtures/test-authority/root.pem \
    --mint-limit 0 --registration-quota 0 \
    $("$bin/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0) 2>>"$work/attestd.log" &
  local pid=$!
  pids+=($pid)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
  local rows_before
  rows_before=$(sqlite3 "$db" "SELECT count(*) FROM audit_log")
  local flooder=""
  if [ "$2" -gt 0 ]; then
    python3 - "$port" "$2" "$clid" > "$work/flood.out" 2>&1 <<'EOF' &
import base64, os, socket, sys, threading, urllib.parse
port, total, clid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def junk(n):
    key = base64.b64encode(os.urandom(32)).decode()
    client = "clid_random%d" % n if n % 9 in (1, 2) else clid
    if n % 3 == 0:
        path, ctype, body = "/v1/oauth/app-attest/challenge", "application/json", '{"client_id":"clid_random%d","key_id":"%s"}' % (n, key)
    elif n % 3 == 1:
        path, ctype, body = "/v1/oauth/app-attest/register", "application/json", '{"client_id":"%s","key_id":"%s","attestation_object":"AAAA"}' % (client, key)
    else:
        path, ctype, body = "/v1/oauth/token", "application/x-www-form-urlencoded", \
            "grant_type=urn%%3Aanthropic%%3Aparams%%3Aoauth%%3Agrant-type%%3Aapp-attest&client_id=%s&key_id=%s&assertion=AAAA" % (client, urllib.parse.quote(key, safe=""))
    return ("POST %s HTTP/1.1\r\nHost: a\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (path, ctype, len(body), body)).encode()
answered = [0] * 8
def worker(i):
    # From an address of its own (the devices use 127.0.0.1): one attacker, its own per-address limits.
    s = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
    share = total // 8 + (1 if i < total % 8 else 0)
    sent = 0
    buffer = b""
    while sent < share:
        batch = min(200, share - sent)
        s.sendall(b"".join(junk(i * 10_000_000 + sent + k) for k in range(batch)))
        sent += batch
        got = 0
        while got < batch:
            data = s.recv(1 << 20)
            if not data: return
            buffer += data
            while True:
                end = buffer.find(b"\r\n\r\n")
                if end < 0: break
                head = buffer[:end].decode("latin1")
                length = next((int(l.split(":")[1]) for l in head.split("\r\n") if l.lower().startswith("content-length:")), 0)
                if len(buffer) < end + 4 + length: break
                buffer = buffer[end + 4 + length:]
                got += 1
        answered[i] += got
threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(sum(answered))
EOF
    flooder=$!
    pids+=($flooder)
  fi
  local out
  out=$($bin/attest-sim load --base-url "http://127.0.0.1:$port" --client-id "$clid" --devices 64 --seconds "$seconds" 2>&1) || {
    echo "$1: FAILED: $(grep -E "error|FAILED|failed" <<<"$out" | tail -4)"; [ -n "$flooder" ] && kill "$flooder" 2>/dev/null; kill -9 $pid; return 1; }
  if [ -n "$flooder" ]; then wait "$flooder"; fi
  sleep 1   # the audit log writes a few times a second; one more flush after the last refusal
  kill -9 $pid; wait $pid 2>/dev/null || true
  local rows bytes
  rows=$(( $(sqlite3 "$db" "SELECT count(*) FROM audit_log") - rows_before ))
  bytes=$(sqlite3 "$db" "SELECT coalesce(sum(length(action) + length(coalesce(client_id,'')) + length(coalesce(key_id,'')) + length(coalesce(reason,'')) + length(coalesce(detail,'')) + 24), 0) FROM audit_log WHERE actor IS NULL")
  local p99 rate
  p99=$(grep -oE '^latency_ms_p99: [0-9.]+' <<<"$out" | head -1 | awk '{print $2}')
  rate=$(grep -oE '^token_exchanges_per_second: [0-9.]+' <<<"$out" | head -1 | awk '{print $2}')
  local sent=0
  [ -n "$flooder" ] && sent=$(tail -1 "$work/flood.out")
  echo "$1: flood $sent answered, audit rows added $rows (~$bytes bytes), exchanges/s ${rate:-?}, p99 ${p99:-?} ms"
  echo "$1 ${p99:-0}" >> "$work/p99"
}
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then run "round$round-quiet" 0; run "round$round-flood" "$flood"
  else run "round$round-flood" "$flood"; run "round$round-quiet" 0; fi
done
python3 - "$work/p99" <<'EOF'
import statistics, sys, collections
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    label, p99 = line.split()
    rnd, kind = label.split("-")
    runs[rnd][kind] = float(p99)
ratios = [r["flood"] / r["quiet"] for r in runs.values() if r.get("quiet")]
print("exchange p99 with the flood / without, per round: " + ", ".join(f"{x:.2f}" for x in ratios) + f" (median {statistics.median(ratios):.2f})")
EOF
