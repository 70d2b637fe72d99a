#!/usr/bin/env bash
# Token exchanges per second, today's build against a baseline commit, side by side in one run.
#   SQLite: rounds of baseline and current, interleaved (the order swaps every round), at 8, 64
#   and 256 devices, each on a fresh database with the mint, registration and challenge limits off;
#   at 256 the current build runs with --max-connections-per-ip 0; a baseline without that option
#   is not run there (its limit of 64 connections per address would fail most requests).
#   PostgreSQL: two current attestd instances on one database, 256 devices spread over both.
# The load generator is always today's `attest-sim load`, which exits non-zero when any request
# failed: such a run is reported as FAILED and makes this script exit non-zero.
#
# usage: scripts/exchange-bench.sh [BASELINE_COMMIT=bb2ce7c]
# environment: SECONDS_PER_RUN (default 6), ROUNDS (default 3), DEVICES ("8 64 256"), PG=0 to skip PostgreSQL,
#   CURRENT_ARGS (extra attestd options for the current build, such as "--exchange-threads 8").
# Each run also prints attestd's context switches and CPU time per exchange (all its threads, from
# /proc; registrations included), and the machine's over the refresh phase alone (attest-sim --cpu-of):
# attestd, the load generator and the PostgreSQL server together, with the rate two cores could
# reach at that cost.
set -uo pipefail
cd "$(dirname "$0")/.."
baseline=${1:-bb2ce7c}
seconds=${SECONDS_PER_RUN:-6} rounds=${ROUNDS:-3}
read -r -a counts <<< "${DEVICES:-8 64 256}"

swift build -c release >/dev/null || exit 1
current=.build/release
sha=$(git rev-parse --short "$baseline") || exit 1
base_tree=/tmp/exchange-bench-$sha
if [ ! -x "$base_tree/.build/release/attestd" ]; then
  echo "building the baseline $sha in $base_tree (once)"
  rm -rf "$base_tree"
  git worktree add --force --detach "$base_tree" "$sha" >/dev/null 2>&1 || git clone -q . "$base_tree" && git -C "$base_tree" checkout -q "$sha"
  (cd "$base_tree" && swift build -c release --product attestd >/dev/null && swift build -c release --product attestctl >/dev/null) || exit 1
fi
base=$base_tree/.build/release

work=$(mktemp -d /tmp/exchange-bench.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/pg-test-cluster.sh stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
failed=0

secrets() {  # the secrets-key option, for builds that have one (the baseline predates it)
  [ "$1" = "$current" ] && echo "--secrets-key-file $work/attestd.key"
}
supports() {  # supports BIN OPTION: whether that attestd knows the option (help read whole: grep -q
  local help; help=$("$1/attestd" serve --help 2>&1)   # in a pipe would SIGPIPE it, and pipefail then says no)
  grep -q -- "$2" <<< "$help"
}
ticks() {  # user + system CPU of a process so far, all threads, in clock ticks
  awk '{print $14 + $15}' /proc/"$1"/stat 2>/dev/null || echo 0
}
switches() {  # context switches of a process so far, all threads
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s += $2} END {print s + 0}'
}
postmaster() {  # the PostgreSQL cluster's postmaster PID, when one runs
  head -1 "$work/pg/data/postmaster.pid" 2>/dev/null || true
}
setup() {  # setup BIN DB → client ID
  "$1/attestctl" init --db "$2" $(secrets "$1") --owner bench@example.com >/dev/null
  "$1/attestctl" integrations create --db "$2" --actor bench@example.com --name Bench --team-id ABCDE12345 \
    --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])'
}
start() {  # start BIN DB [EXTRA…]: sets $port; the process is tracked for cleanup
  local bin=$1 db=$2; shift 2
  port=$(free_port)
  local admin=(); supports "$bin" --admin-listen && admin=(--admin-listen 127.0.0.1:0)
  "$bin/attestd" serve --db "$db" --listen "127.0.0.1:$port" --trust-anchor Fixtures/test-authority/root.pem \
    $(secrets "$bin") "${admin[@]}" --mint-limit 0 --challenge-limit 0 --registration-quota 0 $("$bin/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0) "$@" 2>>"$work/attestd.log" &
  pids+=($!)
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && return 0; sleep 0.05; done
  echo "attestd did not start: $(tail -3 "$work/attestd.log")"; return 1
}
load() {  # load LABEL KEY CLID DEVICES URL…: one line of figures; KEY and the rate go to $work/rates
  local label=$1 key=$2 clid=$3 n=$4; shift 4
  local urls; urls=$(IFS=,; echo "$*")
  local before=0 cpu0=0; for pid in $WATCH; do before=$((before + $(switches "$pid"))); cpu0=$((cpu0 + $(ticks "$pid"))); done
  local pm; pm=$(postmaster)
  local watch=(); for pid in $WATCH $pm; do watch+=(--cpu-of "$pid"); done
  local out; out=$($current/attest-sim load --base-url "$urls" --client-id "$clid" --devices "$n" --seconds "$seconds" "${watch[@]}" 2>&1)
  local status=$?
  local after=0 cpu1=0; for pid in $WATCH; do after=$((after + $(switches "$pid"))); cpu1=$((cpu1 + $(ticks "$pid"))); done
  local exchanges; exchanges=$(awk '$1 == "token_exchanges:" {print $2}' <<< "$out")
  local cs; cs=$(python3 -c "print(round(($after - $before) / max(1, ${exchanges:-0}), 1))")
  local us; us=$(python3 -c "print(round(($cpu1 - $cpu0) * 1e6 / $(getconf CLK_TCK) / max(1, ${exchanges:-0})))")
  local rate p50 p99 failures
  rate=$(awk '$1 == "token_exchanges_per_second:" {print $2}' <<< "$out")
  p50=$(awk '$1 == "latency_ms_p50:" {print $2}' <<< "$out")
  p99=$(awk '$1 == "latency_ms_p99:" {print $2}' <<< "$out")
  failures=$(awk '$1 ~ /^(failed_exchanges|registration_failures|transport_errors|other_errors):$/ {s += $2} END {print s + 0}' <<< "$out")
  if [ $status -ne 0 ]; then
    failed=1
    echo "  $label: FAILED ($failures failures; rate ${rate:-?}/s not a figure)"
    grep -E "fail|error|status|FAILED" <<< "$out" | sed 's/^/    /' | head -8
    return
  fi
  # The whole machine's CPU per exchange over the refresh phase alone (attestd, the load generator,
  # the database server with its backends), as attest-sim measured it, and the rate two cores could
  # give at that cost with nothing idle: how far the run is from its ceiling.
  local budget; budget=$(WATCH="$WATCH" PM="$pm" EXCHANGES="${exchanges:-0}" python3 -c '
import os, sys
f = dict(l.split(": ", 1) for l in sys.stdin.read().splitlines() if ": " in l)
ex = max(1, int(os.environ["EXCHANGES"]))
per = lambda s: round(float(s) * 1e6 / ex)
a = sum(per(f.get(f"watched_refresh_cpu_seconds_pid_{p}", "0")) for p in os.environ["WATCH"].split())
g = per(f.get("loadgen_refresh_cpu_seconds", "0"))
pm = os.environ["PM"]
d = per(f.get(f"watched_refresh_cpu_seconds_pid_{pm}", "0")) if pm else 0
t = max(1, a + g + d)
print(f"refresh phase: machine {t} µs per exchange (attestd {a}, load generator {g}" + (f", postgres {d}" if d else "") + f"): two cores allow {2e6 / t:.0f}/s")
' <<< "$out")
  echo "  $label: ${rate}/s p50 ${p50} ms p99 ${p99} ms failures 0, $cs context switches and $us µs of attestd CPU per exchange; $budget"
  # The round too: an interleaved pair (same round, same size) is the figure that survives the machine's drift.
  echo "$key $rate $round" >> "$work/rates"
}

echo "== SQLite: baseline $sha against $(git rev-parse --short HEAD), $seconds s per run, $rounds rounds"
for round in $(seq "$rounds"); do
  for n in "${counts[@]}"; do
    order=(base current); [ $((round % 2)) -eq 0 ] && order=(current base)
    for side in "${order[@]}"; do
      bin=$current extra=(); [ "$side" = base ] && bin=$base
      [ "$side" = current ] && read -r -a extra <<< "${CURRENT_ARGS:-}"
      if [ "$n" -gt 64 ]; then
        if supports "$bin" --max-connections-per-ip; then
          extra+=(--max-connections-per-ip 0)
        else
          # Its per-address limit (64) resets most connections from one address: every such run
          # fails, which says nothing of its speed. Not run, and not counted as a failure.
          echo "  round $round, $n devices, $side: not run (this build cannot lift its per-address limit of 64)"
          continue
        fi
      fi
      db=$work/$side-$n-$round.sqlite
      clid=$(setup "$bin" "$db") || { failed=1; continue; }
      start "$bin" "$db" "${extra[@]}" || { failed=1; continue; }
      WATCH=${pids[-1]} load "round $round, $n devices, $side" "$n $side" "$clid" "$n" "http://127.0.0.1:$port"
      kill "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null
    done
  done
done
echo "== SQLite medians (current/baseline)"
touch "$work/rates"
for n in "${counts[@]}"; do
  python3 - "$work/rates" "$n" <<'EOF'
import statistics, sys
rates = {"base": [], "current": []}
for line in open(sys.argv[1]):
    n, side, rate = line.split()[:3]
    if n == sys.argv[2]:
        rates[side].append(float(rate))
b, c = rates["base"], rates["current"]
if b and c:
    print(f"  {sys.argv[2]} devices: baseline {statistics.median(b):.1f}/s, current {statistics.median(c):.1f}/s, ratio {statistics.median(c) / statistics.median(b):.2f}")
elif c:
    print(f"  {sys.argv[2]} devices: current {statistics.median(c):.1f}/s (no valid baseline run)")
EOF
done
# The issue's targets as ratios: each round's current/baseline pair at one size, and the current
# build's 8- and 256-device rates against its 64-device rate of the same round (medians of rounds).
python3 - "$work/rates" <<'EOF'
import statistics, sys
by = {}
for line in open(sys.argv[1]):
    n, side, rate, rnd = line.split()
    by[(n, side, rnd)] = float(rate)
rounds = sorted({k[2] for k in by}, key=int)
def paired(label, num, den, target):
    r = [by[num + (x,)] / by[den + (x,)] for x in rounds if num + (x,) in by and den + (x,) in by]
    if r:
        print(f"  {label}: {statistics.median(r):.2f} (rounds: {', '.join(f'{v:.2f}' for v in r)}; target {target})")
print("== targets, paired within each round")
paired("64 devices, current / baseline", ("64", "current"), ("64", "base"), ">= 2.0")
paired("8 devices / 64 devices, current", ("8", "current"), ("64", "current"), ">= 0.9")
paired("256 devices / 64 devices, current", ("256", "current"), ("64", "current"), ">= 1.0")
EOF

if [ "${PG:-1}" != 0 ]; then
  echo "== PostgreSQL: two attestd on one database, 256 devices (the baseline too when it has PostgreSQL)"
  mkdir -p "$work/pg"
  scripts/pg-test-cluster.sh start "$work/pg" >/dev/null || exit 1
  sides=(current); supports "$base" postgresql && sides=(base current)
  for round in $(seq "$rounds"); do
    for side in "${sides[@]}"; do
      bin=$current extra=(); [ "$side" = base ] && bin=$base
      [ "$side" = current ] && read -r -a extra <<< "${CURRENT_ARGS:-}"
      supports "$bin" --max-connections-per-ip && extra+=(--max-connections-per-ip 0)
      db=pg$round$side
      psql -X -q -h "$work/pg" -p "$(cat "$work/pg/port")" -U postgres -d postgres -c "CREATE DATABASE $db OWNER attest" >/dev/null || { failed=1; continue; }
      pg_url="postgresql://attest:attest-test-password@127.0.0.1:$(cat "$work/pg/port")/$db"
      clid=$(setup "$bin" "$pg_url") || { failed=1; continue; }
      start "$bin" "$pg_url" "${extra[@]}" || { failed=1; continue; }; first=$port; p1=${pids[-1]}
      start "$bin" "$pg_url" "${extra[@]}" || { failed=1; continue; }; second=$port; p2=${pids[-1]}
      WATCH="$p1 $p2" load "round $round, postgresql, 256 devices, two instances, $side" "pg $side" "$clid" 256 "http://127.0.0.1:$first" "http://127.0.0.1:$second"
      kill "$p1" "$p2" 2>/dev/null; wait "$p1" "$p2" 2>/dev/null
    done
  done
  python3 - "$work/rates" <<'EOF'
import statistics, sys
rates = {}
for line in open(sys.argv[1]):
    n, side, rate = line.split()[:3]
    if n == "pg": rates.setdefault(side, []).append(float(rate))
if "current" in rates:
    line = f"  PostgreSQL medians: current {statistics.median(rates['current']):.1f}/s"
    if "base" in rates: line += f", baseline {statistics.median(rates['base']):.1f}/s, ratio {statistics.median(rates['current']) / statistics.median(rates['base']):.2f}"
    print(line)
EOF
fi
exit $failed
