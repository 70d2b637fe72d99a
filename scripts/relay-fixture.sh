# Shared by relay-bench.sh and relay-cost.sh (sourced, from the repository's root): a fixed
# Messages upstream and an nginx proxy_pass in front of it (one nginx, two server blocks), a
# database with one integration whose every policy check is active, the workspace key as the
# service default, `serve PORT [OPTION…]` to start an attestd on that upstream, and
# `serve_floor PORT THREADS` to start the libcurl floor relay (scripts/curl-floor.c), and
# `mint_token PORT`, which registers a simulated device there and writes wrk's request script
# ($work/post.lua) with its token. Set `fixture_name` before sourcing (temp directory, messages).
bin=${bin:-.build/release}

need() { command -v "$1" >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null; } || { echo "${fixture_name:-relay}: needs $2 (apt-get install $2)" >&2; exit 1; }; }
need nginx nginx-light
need wrk wrk
need curl curl
[ -x $bin/attestd ] && [ -x $bin/attestctl ] && [ -x $bin/attest-sim ] && [ -x $bin/upstream-stub ] || swift build -c release >/dev/null

work=$(mktemp -d /tmp/${fixture_name:-relay}.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
upstream_port=$(free_port) proxy_port=$(free_port) auth_port=$(free_port) admin_port=$(free_port)
key="bench-key-not-a-real-key-0000000000"
reply='{"id":"msg_bench","type":"message","role":"assistant","model":"claude-bench","content":[{"type":"text","text":"Hello."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}'

# One nginx process serves both the fixed upstream and the proxy (two server blocks).
mkdir -p "$work/nginx"
cat > "$work/nginx.conf" <<EOF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx/error.log warn;
daemon on;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body; proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi; uwsgi_temp_path $work/nginx/uwsgi; scgi_temp_path $work/nginx/scgi;
  keepalive_requests 1000000;
  upstream messages { server 127.0.0.1:$upstream_port; keepalive 64; }
  server {
    listen 127.0.0.1:$upstream_port;
    location / { default_type application/json; add_header request-id req_bench; return 200 '$reply'; }
  }
  server {
    listen 127.0.0.1:$proxy_port;
    location / {
      proxy_pass http://messages;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "";
      proxy_set_header x-api-key "$key";
      proxy_buffering off;
    }
  }
  # nginx as the data plane, attestd as the token check (docs/token-check-for-a-proxy.md's auth_request
  # configuration; the first attestd started listens for admin requests on $admin_port).
  upstream attest_check { server 127.0.0.1:$admin_port; keepalive 64; }
  server {
    listen 127.0.0.1:$auth_port;
    location /v1/messages {
      auth_request /_attest_check;
      proxy_pass http://messages;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "";
      proxy_set_header x-api-key "$key";
      proxy_buffering off;
    }
    location = /_attest_check {
      internal;
      proxy_pass http://attest_check/v1/authz/check;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_set_header X-Original-URI \$request_uri;
    }
  }
}
EOF
nginx -c "$work/nginx.conf" -p "$work/nginx"

# attestd on the same upstream, with the key as the service default; limits off for load.
db="$work/attestd.sqlite"
$bin/attestctl init --db "$db" --owner bench@example.com >/dev/null
clid=$($bin/attestctl integrations create --db "$db" --actor bench@example.com --name Bench --team-id ABCDE12345 \
  --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
# Every policy check active (an allowed model, a max_tokens ceiling, per-device and monthly limits
# too high to bind), so the run measures what they cost, not what they refuse.
$bin/attestctl integrations update "$clid" --db "$db" --actor bench@example.com --models claude-bench --max-tokens 4096 \
  --device-requests-per-minute 1000000000 --monthly-token-budget 1000000000000000 >/dev/null
echo "$key" > "$work/upstream.key"
serve() {  # serve PORT [OPTION…]: attestd ($ATTESTD, default the release build) on the fixed upstream, exchange limits off for load;
          # the first one takes $admin_port for its admin listener (nginx's token check), the others any free port
  local admin
  if [ -z "${admin_taken:-}" ]; then admin="127.0.0.1:$admin_port"; admin_taken=1; else admin="127.0.0.1:0"; fi
  ${ATTESTD:-$bin/attestd} serve --db "$db" --listen "127.0.0.1:$1" --admin-listen "$admin" --trust-anchor Fixtures/test-authority/root.pem \
    --upstream-url "http://127.0.0.1:$upstream_port" --upstream-key-file "$work/upstream.key" \
    --mint-limit 0 --challenge-limit 0 --registration-quota 0 $("$bin/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0) ${THREADS:+--threads "$THREADS"} "${@:2}" 2>>"$work/attestd.log" &
  pids+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$1/healthz" >/dev/null && break; sleep 0.05; done
}
# The floor: the least a relay on libcurl's multi interface costs (scripts/curl-floor.c), built here.
need cc gcc
cc -O2 -Wall -o "$work/curl-floor" scripts/curl-floor.c -lcurl -lpthread \
  || { echo "${fixture_name:-relay}: cannot build scripts/curl-floor.c (libcurl's headers: make installs libcurl4-openssl-dev)" >&2; exit 1; }
serve_floor() {  # serve_floor PORT THREADS: the floor relay on the fixed upstream, with the workspace key
  ${FLOOR_PREFIX:-} "$work/curl-floor" "$1" "http://127.0.0.1:$upstream_port/v1/messages" "$2" "$key" &
  pids+=($!)
  for _ in $(seq 100); do curl -s -o /dev/null -X POST -d '{}' "http://127.0.0.1:$1/v1/messages" && break; sleep 0.05; done
}
# A real token from a simulated device (the device's state file holds it; the tool never prints it).
mint_token() {
  $bin/attest-sim simulate-device --base-url "http://127.0.0.1:$1" --client-id "$clid" --state-dir "$work/device" \
    --app-id ABCDE12345.com.example.app >/dev/null
  token=$(python3 -c 'import json,sys,glob; print(json.load(open(glob.glob(sys.argv[1]+"/client-*.json")[0]))["token"]["token"])' "$work/device")
  # REQUEST=client023: shaped like the published client 0.2.3's (sorted keys, a fallbacks list, a
  # web search tool, its betas and a user profile), so the policy reads every field it governs.
  local body='{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"Hi"}]}' extra=""
  if [ "${REQUEST:-}" = client023 ]; then
    body='{"cache_control":{"type":"ephemeral"},"fallbacks":[{"model":"claude-haiku-4-5"}],"max_tokens":16,"messages":[{"content":"Hi","role":"user"}],"model":"claude-bench","stream":false,"tools":[{"max_uses":3,"name":"web_search","type":"web_search_20260209"}]}'
    extra='wrk.headers["anthropic-beta"] = "feature-1,server-side-fallback-2026-06-01,user-profiles-2026-08-18"
wrk.headers["anthropic-user-profile-id"] = "uprof_bench_1"
wrk.headers["user-agent"] = "ClaudeForFoundationModels/0.2.3 (com.example.app/1.4; Swift/6.3; iOS/27.0.1)"'
  fi
  cat > "$work/post.lua" <<EOF
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["content-type"] = "application/json"
wrk.headers["anthropic-version"] = "2023-06-01"
wrk.headers["authorization"] = "Bearer $token"
$extra
EOF
}
