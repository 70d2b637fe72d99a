#!/usr/bin/env bash
# What budgets in money cost the relay per request, side by side in one run: one attestd (one
# event loop, pinned to CPU 0; wrk and the fixed upstream on CPU 1) serving two integrations in
# two workspaces, both priced (a workspace price for the fixture's model, so every request has a
# cost and its spend is recorded), one with every money budget on (the workspace's monthly and
# daily, the integration's, and each user profile's, all too high to bind) and one with none.
# Requests are shaped like the published client 0.2.3's (with a user profile, so the profile
# budgets read the profile's spend). Rounds alternate between the two tokens; CPU time per
# request is attestd's CPU ticks over the requests it answered 200 (its own /metrics, by route
# only, so the two are told apart by running one at a time).
#
# usage: [PROFILE_BUDGETS=0] [PERF=on|off] scripts/money-budget-cost.sh [ROUNDS=5] [SECONDS=4]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5} seconds=${2:-4}
fixture_name=money-budget-cost
REQUEST=client023
source scripts/relay-fixture.sh
[ "$(nproc)" -ge 2 ] || { echo "money-budget-cost: needs 2 CPUs" >&2; exit 1; }
for pid in $(cat "$work/nginx.pid") $(pgrep -P "$(cat "$work/nginx.pid")"); do taskset -acp 1 "$pid" >/dev/null; done

ctl() { $bin/attestctl --db "$db" "$@"; }
# The fixture's integration (default workspace) gets every budget; a second workspace's integration none.
ctl workspaces create --actor bench@example.com --name off >/dev/null
off=$(ctl integrations create --actor bench@example.com --workspace off --name Off --team-id ABCDE12345 --bundle-id com.example.app --json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
for workspace in default off; do
  ctl prices set --actor bench@example.com --workspace "$workspace" --model claude-bench --input 3 --output 15 --cache-write-5m 3.75 \
    --cache-write-1h 6 --cache-read 0.3 >/dev/null
done
for client in "$clid" "$off"; do
  ctl integrations update "$client" --actor bench@example.com --models claude-bench,claude-haiku-4-5 --device-requests-per-minute 1000000000 >/dev/null
done
# PROFILE_BUDGETS=0: the workspace's and the integration's budgets only (a profile budget adds the
# profile's read, as the profile token budget does: one query by key, which a SQLite reader keeps
# until the next commit, so here, with one profile sending everything, most requests skip it; a
# profile that sends one request per flush interval pays it every time).
profile_budget=1000000000; [ "${PROFILE_BUDGETS:-1}" = 0 ] && profile_budget=0
ctl integrations update "$clid" --actor bench@example.com --monthly-budget-usd 1000000000 --daily-budget-usd 1000000000 \
  --profile-monthly-budget-usd $profile_budget --profile-daily-budget-usd $profile_budget >/dev/null
ctl workspaces set-budget --actor bench@example.com --workspace default --monthly-budget-usd 1000000000 --daily-budget-usd 1000000000 >/dev/null

port=$(free_port)
ATTESTD="taskset -c 0 $bin/attestd" THREADS=1 serve "$port"
pid=${pids[-1]}
# A token for each integration (mint_token writes wrk's script for the fixture's; the other is copied and edited).
mint_token "$port"
cp "$work/post.lua" "$work/on.lua"
rm -rf "$work/device"
clid_on=$clid clid=$off
mint_token "$port"
cp "$work/post.lua" "$work/off.lua"
clid=$clid_on

# Each token is answered 200 (anything else would measure a refusal, not the relay).
for mode in on off; do
  status=$(python3 - "$work/$mode.lua" "$port" <<'PY'
import re, sys, urllib.request
lua = open(sys.argv[1]).read()
body = re.search(r"wrk.body = '(.*)'", lua).group(1)
headers = dict(re.findall(r'wrk.headers\["([^"]+)"\] = "([^"]*)"', lua))
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[2]}/v1/messages", data=body.encode(), headers=headers, method="POST")
try:
    print(urllib.request.urlopen(request).status)
except urllib.error.HTTPError as error:
    print(error.code, error.read()[:300])
PY
)
  [ "$status" = 200 ] || { echo "money-budget-cost: the $mode token is answered $status" >&2; exit 1; }
done
answered() { curl -s "http://127.0.0.1:$admin_port/metrics" | awk -F' ' '/^attestd_http_requests_total\{route="\/v1\/messages",status="200"\}/ {print $2}'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
load() { taskset -c 1 wrk -t1 -c64 -d"$2s" -s "$work/$1.lua" "http://127.0.0.1:$port/v1/messages" >/dev/null; }
for mode in on off; do load $mode 2; done   # warm: connections, caches, the price tables

echo "money budgets: ${rounds} rounds of ${seconds} s, one event loop on CPU 0 (CLK_TCK $(getconf CLK_TCK))"
declare -A cpu
for round in $(seq "$rounds"); do
  # Which goes first alternates, so neither side always runs on the machine the other left.
  order="on off"; [ $((round % 2)) = 0 ] && order="off on"
  for mode in $order; do
    before=$(answered) t0=$(cpu_ticks)
    if [ -n "${PERF:-}" ] && [ "$round" = 2 ] && [ "$mode" = "$PERF" ]; then
      perf record -F 999 -g -o "$work/perf.data" -p "$pid" -- sleep "$seconds" >/dev/null 2>&1 &
      perf_pid=$!
    fi
    load $mode "$seconds"
    [ -n "${perf_pid:-}" ] && { wait "$perf_pid" 2>/dev/null || true; perf_pid=; }
    [ -f "$work/perf.data" ] && { perf report -i "$work/perf.data" --stdio --no-children -g none --percent-limit 0.2 2>/dev/null | grep -v "^$" | head -200 > /tmp/money-budget-perf.txt; rm -f "$work/perf.data"; }
    t1=$(cpu_ticks) after=$(answered)
    us=$(python3 -c "import sys; t, n = float(sys.argv[1]), int(sys.argv[2]); print(f'{t * 1e6 / int(sys.argv[3]) / n:.1f}')" \
      "$((t1 - t0))" "$((after - before))" "$(getconf CLK_TCK)")
    printf '%-6s budgets-%-4s cpu_us_per_request=%s requests=%s\n' "$round" "$mode" "$us" "$((after - before))"
    cpu[$mode]+="$us "
  done
done
# The budgets did count: the integration with them has its spend recorded, and nothing was refused.
sleep 1.5
ctl usage --json --by integration | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
for r in rows:
    if "forecast" not in r: print("  %s… requests %s cost_micro_usd %s refused %s" % (r["client_id"][:14], r["requests"], r["cost_micro_usd"], r.get("refused", {})))'
python3 - "${cpu[on]}" "${cpu[off]}" <<'EOF'
import statistics, sys
on = [float(x) for x in sys.argv[1].split()]
off = [float(x) for x in sys.argv[2].split()]
m_on, m_off = statistics.median(on), statistics.median(off)
print(f"median cpu_us_per_request: budgets on {m_on:.1f}, off {m_off:.1f}, ratio {m_on / m_off:.3f} ({(m_on / m_off - 1) * 100:+.1f}%)")
# Rounds side by side: the median of each round's own ratio is steadier on a shared machine.
ratios = [a / b for a, b in zip(on, off)]
print(f"median of the rounds' ratios: {statistics.median(ratios):.3f}; min CPU per request: on {min(on):.1f}, off {min(off):.1f}, ratio {min(on) / min(off):.3f}")
EOF
