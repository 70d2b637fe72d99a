#!/usr/bin/env bash
# scripts/exchange-ab.sh DEVICES ROUNDS LABEL=BIN_DIR:ATTESTD_ARGS …
# Option sets (or builds) side by side: fresh SQLite databases, the limits lifted, 6-s runs of
# attest-sim load in rotating order; prints each run and the medians (rate, p99, context switches
# per exchange, attestd's CPU per exchange), the first variant as the baseline. Above 64 devices each
# variant gets --max-connections-per-ip 0 unless its arguments set that option. A failed run is reported FAILED, never a figure.
# Example: scripts/exchange-ab.sh 64 4 "two=.build/release:--exchange-threads 2" "eight=.build/release:--exchange-threads 8"
root=$(cd "$(dirname "$0")/.." && pwd)
n=$1; rounds=$2; shift 2
variants=("$@")
w=$(mktemp -d /tmp/exchange-ab.XXXX)
trap 'kill $pid 2>/dev/null; rm -rf "$w"' EXIT
run() {
  local label=${1%%=*} spec=${1#*=}; local B=${spec%%:*} args=${spec#*:}
  case $B in /*) ;; *) B=$root/$B ;; esac
  # More devices than the per-address limit (64) from one address: lift it, as exchange-bench.sh does.
  [ "$n" -gt 64 ] && [[ $args != *--max-connections-per-ip* ]] && args="$args --max-connections-per-ip 0"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  rm -rf $w/d; mkdir $w/d
  $B/attestctl init --db $w/d/db.sqlite --owner b@example.com >/dev/null
  clid=$($B/attestctl integrations create --db $w/d/db.sqlite --actor b@example.com --name B --team-id ABCDE12345 --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
  $B/attestd serve --db $w/d/db.sqlite --listen 127.0.0.1:$port --trust-anchor $root/Fixtures/test-authority/root.pem --mint-limit 0 --challenge-limit 0 --registration-quota 0 $("$B/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0) $args 2>$w/log & pid=$!
  for _ in $(seq 100); do curl -sf http://127.0.0.1:$port/healthz >/dev/null && break; sleep 0.05; done
  cs0=$(cat /proc/$pid/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s+=$2} END {print s}'); cpu0=$(awk '{print $14+$15}' /proc/$pid/stat)
  out=$($root/.build/release/attest-sim load --base-url http://127.0.0.1:$port --client-id $clid --devices $n --seconds 6 2>&1); st=$?
  cs1=$(cat /proc/$pid/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s+=$2} END {print s}'); cpu1=$(awk '{print $14+$15}' /proc/$pid/stat)
  ex=$(awk '$1=="token_exchanges:" {print $2}' <<< "$out")
  kill $pid; wait $pid 2>/dev/null
  rate=$(awk '$1=="token_exchanges_per_second:" {print $2}' <<< "$out"); p99=$(awk '$1=="latency_ms_p99:" {print $2}' <<< "$out")
  [ $st -ne 0 ] && rate="FAILED"
  cs=$(python3 -c "print(round(($cs1-$cs0)/max(1,$ex),2))")
  # attestd's CPU (user + system, all threads, clock ticks of 10 ms) per exchange, registrations included.
  us=$(python3 -c "print(round(($cpu1-$cpu0)*1e6/$(getconf CLK_TCK)/max(1,$ex)))")
  echo "$label $rate $p99 $cs $us" >> $w/results
  echo "  $label: $rate/s p99 $p99 ms, $cs context switches and ${us} µs of attestd CPU per exchange"
}
for r in $(seq $rounds); do
  k=${#variants[@]}
  for i in $(seq 0 $((k-1))); do run "${variants[$(( (i + r) % k ))]}"; done
done
echo "medians ($n devices, $rounds rounds):"
python3 - $w/results <<'PY'
import sys, statistics as st
rows={}
for line in open(sys.argv[1]):
    l,r,p,c,u=line.split()
    if r=="FAILED": rows.setdefault(l,[]).append(None); continue
    rows.setdefault(l,[]).append((float(r),float(p),float(c),float(u)))
base=None
for l,v in rows.items():
    ok=[x for x in v if x]
    if len(ok)<len(v): print(f"  {l}: {len(v)-len(ok)} FAILED runs"); 
    if not ok: continue
    m=st.median([x[0] for x in ok]); p=st.median([x[1] for x in ok]); c=st.median([x[2] for x in ok]); u=st.median([x[3] for x in ok])
    if base is None: base=m
    print(f"  {l}: {m:.1f}/s ({m/base:.2f}x the first) p99 {p:.1f} ms, {c:.2f} cs/exchange, {u:.0f} µs attestd CPU/exchange")
PY
rm -rf $w
