#!/usr/bin/env bash
# What one relayed request costs attestd, in measures steadier than requests per second on a
# noisy machine, and for two builds in the same run when a baseline binary is given:
#   cpu_us   CPU time per request: attestd with one event loop, pinned to CPU 0, saturated by
#            wrk (64 connections) pinned with the upstream to CPU 1; interleaved rounds
#   mallocs  malloc calls per request (a perf uprobe on glibc's malloc; skipped without perf), and
#            the floor's
#   syscalls system calls per request by kind, the floor's too (strace -c; strace slows the
#            process, so the counts are right but curl finds more replies already there than at full speed)
#   floor    in the same rounds, CPU per request of scripts/curl-floor.c (a bare C relay on libcurl,
#            one thread, pinned like attestd) and of nginx's proxy_pass: nginx's CPU per proxied
#            request less its CPU per request while it only serves the upstream (the floor's run)
# Requests are counted from attestd's own /metrics, so wrk's in-flight tail does not skew them
# (the floor and nginx are counted by wrk).
#
# usage: scripts/relay-cost.sh [ROUNDS=3] [SECONDS=4] [BASELINE_ATTESTD]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} seconds=${2:-4} baseline=${3:-}
fixture_name=relay-cost
source scripts/relay-fixture.sh
need strace strace
[ "$(nproc)" -ge 2 ] || { echo "relay-cost: needs 2 CPUs (attestd on one, load and upstream on the other)" >&2; exit 1; }
for pid in $(cat "$work/nginx.pid") $(pgrep -P "$(cat "$work/nginx.pid")"); do taskset -acp 1 "$pid" >/dev/null; done

builds=("current=$bin/attestd")
[ -n "$baseline" ] && builds+=("baseline=$baseline")
declare -A port pidof
for build in "${builds[@]}"; do
  name=${build%%=*}
  port[$name]=$(free_port)
  ATTESTD="taskset -c 0 ${build#*=}" THREADS=1 serve "${port[$name]}"
  pidof[$name]=${pids[-1]}
done
mint_token "${port[current]}"
floor_port=$(free_port)
FLOOR_PREFIX="taskset -c 0" serve_floor "$floor_port" 1
answered() {  # answered NAME → relayed requests answered 200 so far
  curl -s "http://127.0.0.1:${port[$1]}/metrics" | awk -F' ' '/^attestd_http_requests_total\{route="\/v1\/messages",status="200"\}/ {print $2}'
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
floor_pid=${pids[-1]}
nginx_ticks() { local sum=0 pid; for pid in $(pgrep -P "$(cat "$work/nginx.pid")"); do sum=$((sum + $(cpu_ticks "$pid"))); done; echo $sum; }
load() {  # load NAME SECONDS CONNECTIONS
  taskset -c 1 wrk -t1 -c"$3" -d"$2s" -s "$work/post.lua" "http://127.0.0.1:${port[$1]}/v1/messages" >/dev/null
}
for build in "${builds[@]}"; do load "${build%%=*}" 2 16; done  # warm: connections, caches

echo "relay cost: ${rounds} rounds of ${seconds} s, one event loop on CPU 0 (CLK_TCK $(getconf CLK_TCK))"
declare -A cpu
for round in $(seq "$rounds"); do
  for build in "${builds[@]}"; do
    name=${build%%=*} pid=${pidof[${build%%=*}]}
    before=$(answered "$name") t0=$(cpu_ticks "$pid")
    load "$name" "$seconds" 64
    t1=$(cpu_ticks "$pid") after=$(answered "$name")
    us=$(python3 -c "import sys; t, n = float(sys.argv[1]), int(sys.argv[2]); print(f'{t * 1e6 / int(sys.argv[3]) / n:.1f}')" \
      "$((t1 - t0))" "$((after - before))" "$(getconf CLK_TCK)")
    printf '%-6s %-9s cpu_us_per_request=%s requests=%s\n' "$round" "$name" "$us" "$((after - before))"
    cpu[$name]+="$us "
  done
  # The floor and nginx, each with the CPU ticks of the floor and of nginx over wrk's request count.
  for target in curl-floor nginx; do
    [ $target = nginx ] && url="http://127.0.0.1:$proxy_port/v1/messages" || url="http://127.0.0.1:$floor_port/v1/messages"
    f0=$(cpu_ticks "$floor_pid") n0=$(nginx_ticks)
    requests=$(taskset -c 1 wrk -t1 -c64 -d"${seconds}s" -s "$work/post.lua" "$url" | awk '/requests in/ {print $1}')
    f1=$(cpu_ticks "$floor_pid") n1=$(nginx_ticks)
    read -r floor_us nginx_us < <(python3 -c "import sys; k = 1e6 / int(sys.argv[3]) / int(sys.argv[4]); print(f'{int(sys.argv[1]) * k:.1f} {int(sys.argv[2]) * k:.1f}')" \
      "$((f1 - f0))" "$((n1 - n0))" "$(getconf CLK_TCK)" "$requests")
    if [ $target = curl-floor ]; then
      upstream_us=$nginx_us
      printf '%-6s %-9s cpu_us_per_request=%s requests=%s (the upstream nginx: %s)\n' "$round" curl-floor "$floor_us" "$requests" "$upstream_us"
      cpu[curl-floor]+="$floor_us "
    else
      proxy_us=$(python3 -c "print(f'{float(\"$nginx_us\") - float(\"$upstream_us\"):.1f}')")
      printf '%-6s %-9s cpu_us_per_request=%s requests=%s (proxy and upstream together: %s)\n' "$round" nginx "$proxy_us" "$requests" "$nginx_us"
      cpu[nginx]+="$proxy_us "
    fi
  done
done
for name in "${builds[@]%%=*}" curl-floor nginx; do
  echo "median $name: $(python3 -c 'import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))' ${cpu[$name]}) µs of CPU per request"
done

if command -v perf >/dev/null && perf probe -q -x "$(ldconfig -p | awk '/libc.so.6 .*x86-64/ {print $NF; exit}')" malloc 2>/dev/null \
   || perf probe -l 2>/dev/null | grep -q 'probe_libc:malloc'; then
  for build in "${builds[@]}"; do
    name=${build%%=*}
    before=$(answered "$name")
    perf stat -e probe_libc:malloc -p "${pidof[$name]}" -o "$work/perf-$name.txt" -- taskset -c 1 \
      wrk -t1 -c8 -d"${seconds}s" -s "$work/post.lua" "http://127.0.0.1:${port[$name]}/v1/messages" >/dev/null 2>&1
    after=$(answered "$name")
    calls=$(awk '/probe_libc:malloc/ {gsub(",", "", $1); print $1}' "$work/perf-$name.txt")
    echo "$name: $(python3 -c "print(round($calls / $((after - before)), 1))") mallocs per request"
  done
  requests=$(perf stat -e probe_libc:malloc -p "$floor_pid" -o "$work/perf-floor.txt" -- taskset -c 1 \
    wrk -t1 -c8 -d"${seconds}s" -s "$work/post.lua" "http://127.0.0.1:$floor_port/v1/messages" 2>/dev/null | awk '/requests in/ {print $1}')
  calls=$(awk '/probe_libc:malloc/ {gsub(",", "", $1); print $1}' "$work/perf-floor.txt")
  echo "curl-floor: $(python3 -c "print(round($calls / $requests, 1))") mallocs per request (all of them libcurl's)"
else
  echo "mallocs: skipped (perf cannot probe glibc's malloc here)"
fi

for build in "${builds[@]}"; do
  name=${build%%=*}
  before=$(answered "$name")
  strace -q -c -f -p "${pidof[$name]}" -o "$work/strace-$name.txt" 2>/dev/null & tracer=$!
  sleep 0.5
  load "$name" "$seconds" 16
  kill -INT "$tracer"; wait "$tracer" 2>/dev/null || true
  after=$(answered "$name")
  echo "$name system calls per request: $(awk -v n=$((after - before)) '$4 ~ /^[0-9]+$/ && $NF != "total" && $4 / n >= 0.05 {printf "%s %.2f, ", $NF, $4 / n}' "$work/strace-$name.txt" | sed 's/, $//')"
done
strace -q -c -f -p "$floor_pid" -o "$work/strace-floor.txt" 2>/dev/null & tracer=$!
sleep 0.5
requests=$(taskset -c 1 wrk -t1 -c16 -d"${seconds}s" -s "$work/post.lua" "http://127.0.0.1:$floor_port/v1/messages" | awk '/requests in/ {print $1}')
kill -INT "$tracer"; wait "$tracer" 2>/dev/null || true
echo "curl-floor system calls per request: $(awk -v n="$requests" '$4 ~ /^[0-9]+$/ && $NF != "total" && $4 / n >= 0.05 {printf "%s %.2f, ", $NF, $4 / n}' "$work/strace-floor.txt" | sed 's/, $//')"
