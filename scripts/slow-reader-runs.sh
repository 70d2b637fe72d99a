#!/usr/bin/env bash
# The slow readers five times in each shape: 5,000 connections from 200 addresses pipelining
# requests and never reading (scripts/attack-bench.py noread), each run against a fresh attestd
# (release) with a legitimate client doing /healthz and a whole token exchange once a second;
# prints their median, p99 and slowest round (with under 100 rounds the p99 is the slowest).
# usage: scripts/slow-reader-runs.sh [SECONDS_PER_RUN=20] [RUNS=5] [SHAPES="small deep"]   (BIN=… another build)
# shapes: small: 50 pipelined GET /healthz a connection, 1 KiB receive buffers (answers soon wait
#                unsent in attestd's socket);
#         deep:  200 pipelined GET /metrics (404 on the public listener), the kernel's default
#                receive buffer (128 KiB: it takes every answer, none waits unsent).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-.build/release}
export ATTEST_SIM=${ATTEST_SIM:-$bin/attest-sim}   # the legitimate client
ulimit -n 65536 2>/dev/null || true
for shape in ${3:-small deep}; do
case $shape in
  small) shape_env=(PIPELINE=50 ROUTE=healthz RCVBUF=1024) ;;
  deep) shape_env=(PIPELINE=200 ROUTE=metrics RCVBUF=0) ;;
  *) echo "unknown shape $shape (small, deep)" >&2; exit 2 ;;
esac
for run in $(seq 1 "${2:-5}"); do
  work=$(mktemp -d /tmp/noread.XXXXXX)
  db=$work/a.sqlite
  $bin/attestctl init --db "$db" --owner b@example.com >/dev/null
  clid=$($bin/attestctl integrations create --db "$db" --actor b@example.com --name B --team-id ABCDE12345 --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  $bin/attestd serve --db "$db" --admin-listen none --listen "127.0.0.1:$port" --trust-anchor Fixtures/test-authority/root.pem $($bin/attestd serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0) 2>"$work/log" &
  pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
  echo "[$shape run $run] ${shape_env[*]}"
  env "${shape_env[@]}" CLIENT_ID=$clid python3 scripts/attack-bench.py "$port" noread 5000 ${1:-20} "$pid" 2>&1 | grep -E "noread|healthz|exchange|p99|over" | head -6
  kill $pid; wait $pid 2>/dev/null || true
  rm -rf "$work"
done
done
