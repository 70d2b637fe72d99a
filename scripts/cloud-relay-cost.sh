#!/usr/bin/env bash
# The relay's cost per request on each upstream kind, side by side in one run: one attestd with
# six workspaces — the Anthropic API (the fixed nginx upstream of relay-fixture.sh), Amazon
# Bedrock on its Messages API and on InvokeModel, Google Vertex AI, and the Anthropic-compatible
# kind as Microsoft Foundry (an API key) and Claude Platform on AWS (SigV4 for
# aws-external-anthropic) (the TLS stubs of Tests/Support/cloud-stubs, which verify each
# signature, token or key and forward to the same fixed upstream). Interleaved rounds of wrk
# against each; prints per round requests/s and attestd's CPU per request, then the medians and
# each cloud kind's CPU per request over the Anthropic kind's. Then the added latency of one
# failover: sequential requests to a workspace whose first upstream answers 529 (Foundry's stub,
# a scripted deployment) and whose second serves (the same stub), against requests served by
# that second upstream alone; attestd runs with the shortest cool-down, and requests are spaced
# past it, so every one of them fails over once.
#
# The Python stubs bound a cloud kind's throughput far below the Anthropic kind's, so compare
# the CPU per request, not requests/s; CONNECTIONS stays low so that every kind runs unsaturated.
#
# attestd's CPU with no load, measured for as long in each round, is subtracted from each run.
#
#   scripts/cloud-relay-cost.sh [SECONDS_PER_RUN=5] [ROUNDS=3] [CONNECTIONS=4]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5} rounds=${2:-3} connections=${3:-4}
fixture_name=cloud-relay-cost
source scripts/relay-fixture.sh
[ -x .venv/bin/python ] || make venv >/dev/null

# TLS for the stubs, an AWS key, a service account.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$work/ca.key" -out "$work/ca.pem" -days 1 \
  -subj "/CN=cloud bench CA" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$work/server.key" -out "$work/server.csr" -subj "/CN=127.0.0.1" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$work/server.ext"
openssl x509 -req -in "$work/server.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial -out "$work/server.pem" -days 1 \
  -extfile "$work/server.ext" 2>/dev/null
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$work/sa.pem" 2>/dev/null
openssl pkey -in "$work/sa.pem" -pubout -out "$work/sa.pub"
echo "bench/secret+KEY000000000000000000000000" > "$work/aws-secret"
python3 -c 'import json,sys; print(json.dumps({"type":"service_account","project_id":"bench-project","private_key_id":"benchkey0001",
  "private_key":open(sys.argv[1]).read(),"client_email":"relay@bench-project.iam.gserviceaccount.com",
  "token_uri":"https://oauth2.googleapis.com/token"}))' "$work/sa.pem" > "$work/sa.json"

stub() {  # stub NAME SCRIPT ARGS…: started in this shell (its pid joins the cleanup); its port is in $work/NAME.port
  .venv/bin/python "Tests/Support/cloud-stubs/$2.py" --cert "$work/server.pem" --key "$work/server.key" \
    --anthropic-url "http://127.0.0.1:$upstream_port" --anthropic-key "$key" "${@:3}" > "$work/$1.port" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 100); do grep -q PORT "$work/$1.port" 2>/dev/null && break; sleep 0.05; done
}
echo "foundry-bench-key-0123456789abcdef" > "$work/foundry-key"
stub bedrock_stub bedrock_stub --region us-east-1 --access-key-id AKIABENCH000000001 --secret-key-file "$work/aws-secret"
stub vertex_stub vertex_stub --project bench-project --region us-east5 --public-key-file "$work/sa.pub" \
  --client-email relay@bench-project.iam.gserviceaccount.com
stub foundry compatible_stub --service foundry --api-key-file "$work/foundry-key" --deployment bench-deployment=claude-bench \
  --deployment overloaded-deployment=claude-bench
stub platform compatible_stub --service claude-platform-aws --anthropic-workspace-id wrkspc_bench --region us-east-1 \
  --access-key-id AKIABENCH000000001 --secret-key-file "$work/aws-secret"
bedrock_port=$(awk '/PORT/ {print $2}' "$work/bedrock_stub.port")
vertex_port=$(awk '/PORT/ {print $2}' "$work/vertex_stub.port")
foundry_port=$(awk '/PORT/ {print $2}' "$work/foundry.port")
platform_port=$(awk '/PORT/ {print $2}' "$work/platform.port")

ctl() { $bin/attestctl "$@" --db "$db" >/dev/null; }
ctl workspaces create --actor bench@example.com --name aws
ctl workspaces create --actor bench@example.com --name gcp
ctl workspaces create --actor bench@example.com --name awsinvoke
for ws in foundry platform failover direct; do ctl workspaces create --actor bench@example.com --name $ws; done
ctl workspaces set-upstream-foundry --actor bench@example.com --workspace foundry --resource bench --api-key-file "$work/foundry-key" \
  --endpoint-url "https://127.0.0.1:$foundry_port" --model claude-bench=bench-deployment
ctl workspaces set-upstream-claude-platform-aws --actor bench@example.com --workspace platform --region us-east-1 \
  --anthropic-workspace-id wrkspc_bench --access-key-id AKIABENCH000000001 --secret-key-file "$work/aws-secret" \
  --endpoint-url "https://127.0.0.1:$platform_port" --model claude-bench=claude-bench
# Failover: the first upstream answers 529, the second serves; `direct` has the second alone.
ctl workspaces set-upstream-foundry --actor bench@example.com --workspace failover --upstream busy --priority 1 --resource bench \
  --api-key-file "$work/foundry-key" --endpoint-url "https://127.0.0.1:$foundry_port" --model claude-bench=overloaded-deployment
for ws in failover direct; do
  ctl workspaces set-upstream-foundry --actor bench@example.com --workspace $ws --upstream serving --priority 2 --resource bench \
    --api-key-file "$work/foundry-key" --endpoint-url "https://127.0.0.1:$foundry_port" --model claude-bench=bench-deployment
done
ctl workspaces set-upstream-bedrock --actor bench@example.com --workspace aws --region us-east-1 --access-key-id AKIABENCH000000001 \
  --secret-key-file "$work/aws-secret" --endpoint-url "https://127.0.0.1:$bedrock_port" --model claude-bench=claude-bench
ctl workspaces set-upstream-bedrock --actor bench@example.com --workspace awsinvoke --api invoke --region us-east-1 \
  --access-key-id AKIABENCH000000001 --secret-key-file "$work/aws-secret" --endpoint-url "https://127.0.0.1:$bedrock_port" \
  --model claude-bench=claude-bench
ctl workspaces set-upstream-vertex --actor bench@example.com --workspace gcp --project bench-project --region us-east5 \
  --service-account-file "$work/sa.json" --endpoint-url "https://127.0.0.1:$vertex_port" \
  --token-url "https://127.0.0.1:$vertex_port/token" --model claude-bench=claude-bench
declare -A clients=([anthropic]="$clid")
for ws in aws awsinvoke gcp foundry platform failover direct; do
  c=$($bin/attestctl integrations create --db "$db" --actor bench@example.com --workspace $ws --name Bench --team-id ABCDE12345 \
    --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
  ctl integrations update "$c" --actor bench@example.com --models claude-bench --max-tokens 4096 \
    --device-requests-per-minute 1000000000 --monthly-token-budget 1000000000000000
  clients[$ws]=$c
done

port=$(free_port)
serve "$port" --upstream-ca-file "$work/ca.pem" --upstream-cooldown 0.01 --upstream-cooldown-max 0.01
attestd_pid=${pids[-1]}
kinds="anthropic aws awsinvoke gcp foundry platform"
# One device (and wrk script) per workspace.
declare -A scripts tokens
for kind in $kinds failover direct; do
  clid=${clients[$kind]}
  mint_token "$port"
  mv "$work/post.lua" "$work/post-$kind.lua"
  rm -rf "$work/device"
  scripts[$kind]="$work/post-$kind.lua" tokens[$kind]=$token
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
declare -A cpu rps
printf '%-6s %-10s %8s %10s\n' round kind req/s cpu_us/req
for round in $(seq "$rounds"); do
  # What attestd spends with no request (its timers, the ledger's flush, the monitor's tick):
  # subtracted from each run, so that a slow kind's few requests are not charged for it.
  before=$(cpu_ticks "$attestd_pid"); sleep "$seconds"; idle=$(( $(cpu_ticks "$attestd_pid") - before ))
  for kind in $kinds; do
    before=$(cpu_ticks "$attestd_pid")
    out=$(wrk -t1 -c"$connections" -d"${seconds}s" -s "${scripts[$kind]}" "http://127.0.0.1:$port/v1/messages" 2>&1)
    after=$(cpu_ticks "$attestd_pid")
    requests=$(awk '/requests in/ {print $1}' <<<"$out")
    if grep -q "Non-2xx" <<<"$out"; then echo "round $round $kind: FAILED (non-2xx answers)"; echo "$out" >&2; exit 1; fi
    r=$(awk -v n="$requests" -v s="$seconds" 'BEGIN {printf "%.0f", n / s}')
    c=$(awk -v t=$((after - before - idle)) -v n="$requests" -v hz="$hz" 'BEGIN {printf "%.1f", (t < 0 ? 0 : t) / hz * 1e6 / n}')
    printf '%-6s %-10s %8s %10s\n' "$round" "$kind" "$r" "$c"
    cpu[$kind]+="$c " rps[$kind]+="$r "
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
base=$(median <<<"${cpu[anthropic]}")
for kind in $kinds; do
  m=$(median <<<"${cpu[$kind]}")
  printf 'median %-9s req/s %6s  attestd CPU per request %6s us  (%.2f x the Anthropic kind)\n' "$kind" \
    "$(median <<<"${rps[$kind]}")" "$m" "$(awk -v a="$m" -v b="$base" 'BEGIN {print a / b}')"
done

# The added latency of one failover: N sequential requests each, alternating, spaced past the
# cool-down so that every request to `failover` tries the busy upstream first.
python3 - "$port" "${tokens[failover]}" "${tokens[direct]}" "${FAILOVER_REQUESTS:-200}" <<'PY'
import http.client, json, statistics, sys, time
port, failover, direct, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
body = json.dumps({"model": "claude-bench", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]})
connection = http.client.HTTPConnection("127.0.0.1", port)
def once(token):
    start = time.perf_counter()
    connection.request("POST", "/v1/messages", body, {"authorization": "Bearer " + token, "content-type": "application/json"})
    response = connection.getresponse()
    response.read()
    if response.status != 200:
        raise SystemExit(f"a request answered {response.status}")
    return (time.perf_counter() - start) * 1000
times = {"failover": [], "direct": []}
for i in range(n):
    for name, token in (("failover", failover), ("direct", direct)):
        time.sleep(0.02)
        times[name].append(once(token))
f, d = statistics.median(times["failover"]), statistics.median(times["direct"])
fp = sorted(times["failover"])[int(n * 0.9)]; dp = sorted(times["direct"])[int(n * 0.9)]
print(f"failover: {n} requests each; median {f:.2f} ms with one failover, {d:.2f} ms served directly: "
      f"+{f - d:.2f} ms per failover (p90 {fp:.2f} vs {dp:.2f} ms)")
PY
