#!/usr/bin/env python3
"""Attacks a running attestd the way issue 10 describes while a legitimate client, once a second,
sends GET /healthz on a new connection and does a full token exchange as a fresh install does
(attest-sim simulate-device in a new state directory: challenge, attestation, register); prints
per attack how many of each succeeded, their p50/p99 and attestd's peak RSS. Attackers connect
from 200 loopback addresses (127.0.1.2-201).

usage: scripts/attack-bench.py PORT MODES CONNECTIONS SECONDS [ATTESTD_PID]
  MODES, comma-separated (or "all"), each run in turn for SECONDS:
    head:   a partial request head, one more byte every 5 s (reconnecting when cut)
    body:   a token request whose 60,000-byte body arrives one byte every 5 s
    noread: PIPELINE (default 50) pipelined requests per connection, responses never read
  CLIENT_ID=clid_… enables the exchange: an integration for APP_ID (default
  ABCDE12345.com.example.app) on a server started with --trust-anchor Fixtures/test-authority/root.pem.
  ATTEST_SIM is the attest-sim binary (default .build/release/attest-sim, else .build/debug/attest-sim).
  The exchange's time includes starting attest-sim; its time with no attack is printed first.
e.g. .build/release/attestd serve --listen 127.0.0.1:8090 --trust-anchor Fixtures/test-authority/root.pem &
     CLIENT_ID=clid_… scripts/attack-bench.py 8090 all 5000 30 $!"""
import json, os, shutil, socket, subprocess, sys, tempfile, threading, time

if len(sys.argv) < 5:
    sys.exit(__doc__)
port, modes, count, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
pid = int(sys.argv[5]) if len(sys.argv) > 5 else None
modes = ["head", "body", "noread"] if modes == "all" else modes.split(",")
client_id = os.environ.get("CLIENT_ID")
app_id = os.environ.get("APP_ID", "ABCDE12345.com.example.app")
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
attest_sim = os.environ.get("ATTEST_SIM") or next(
    (p for p in (os.path.join(root, ".build", b, "attest-sim") for b in ("release", "debug")) if os.path.exists(p)), None)
if client_id and not attest_sim:
    sys.exit("no attest-sim binary: build it or set ATTEST_SIM")


def open_one(mode, i):
    src = "127.0.%d.%d" % (1 + (i % 200) // 250, 2 + (i % 200) % 250)
    s = socket.socket(); s.setblocking(True); s.settimeout(2)
    try:
        s.bind((src, 0)); s.connect(("127.0.0.1", port))
        if mode == "head": s.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        elif mode == "body": s.send(b"POST /v1/oauth/token HTTP/1.1\r\nHost: a\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 60000\r\n\r\n")
        elif mode == "noread":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            s.send((b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n" if os.environ.get("ROUTE") != "metrics" else b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n") * int(os.environ.get("PIPELINE", "50")))
        else:
            sys.exit("unknown mode %s" % mode)
        s.setblocking(False)
        return s
    except OSError:
        s.close(); return None


class Attack:
    """CONNECTIONS attacking sockets of one mode, kept up (reconnected when cut) until stop()."""
    def __init__(self, mode):
        self.mode, self.socks, self.reopened, self.running = mode, [], 0, True
        self.thread = threading.Thread(target=self.run, daemon=True); self.thread.start()

    def run(self):
        for i in range(count):
            if not self.running: break
            s = open_one(self.mode, i)
            if s: self.socks.append(s)
        while self.running:
            for _ in range(5 if self.mode != "noread" else 1):
                if self.running: time.sleep(1)
            alive = []
            for i, s in enumerate(self.socks):
                try:
                    if self.mode in ("head", "body"): s.send(b"x")
                    alive.append(s)
                except OSError:
                    s.close()
                    n = open_one(self.mode, i)   # the attacker reconnects what the server closed
                    if n: alive.append(n); self.reopened += 1
            self.socks = alive

    def stop(self):
        self.running = False; self.thread.join(10)
        for s in self.socks: s.close()


def healthz():
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        d = c.recv(4096)
        if not d: break
        data += d
    c.close()
    return data.startswith(b"HTTP/1.1 200")


def exchange():
    """A fresh install's whole exchange through the published client's logic: True if registered."""
    state = tempfile.mkdtemp(prefix="attack-bench-device-")
    try:
        done = subprocess.run([attest_sim, "simulate-device", "--base-url", "http://127.0.0.1:%d" % port, "--client-id", client_id,
                               "--state-dir", state, "--app-id", app_id], capture_output=True, timeout=15)
        line = done.stdout.decode(errors="replace").split("\n")[0]
        return done.returncode == 0 and json.loads(line).get("source") == "registered"
    except (subprocess.TimeoutExpired, ValueError):
        return False
    finally:
        shutil.rmtree(state, ignore_errors=True)


def timed(call, latencies):
    t = time.time()
    try:
        ok = call()
    except OSError:
        ok = False
    if ok: latencies.append(time.time() - t)
    return ok


def summary(name, ok, total, lat):
    lat = sorted(lat)
    if not lat: return "%s %d/%d" % (name, ok, total)
    p50, p99 = lat[len(lat) // 2] * 1000, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    return "%s %d/%d (%.0f%%), p50 %.1f ms, p99 %.1f ms" % (name, ok, total, 100.0 * ok / total, p50, p99)


def rss_kb():
    try: return int(open("/proc/%d/status" % pid).read().split("VmRSS:")[1].split()[0])
    except (OSError, IndexError, ValueError): return 0


if client_id:
    base = []
    for _ in range(3): timed(exchange, base)
    print(summary("exchange without attack:", len(base), 3, base), flush=True)

for mode in modes:
    attack = Attack(mode)
    time.sleep(2)
    stop = time.time() + seconds
    health, health_ok, trade, trade_ok, rss, total = [], 0, [], 0, [], 0
    while time.time() < stop:
        t = time.time(); total += 1
        health_ok += timed(healthz, health)
        if client_id: trade_ok += timed(exchange, trade)
        if pid: rss.append(rss_kb())
        time.sleep(max(0, 1 - (time.time() - t)))
    attack.stop()
    line = "%s x%d, %g s: %s" % (mode, count, seconds, summary("healthz", health_ok, total, health))
    if client_id: line += " | " + summary("exchange", trade_ok, total, trade)
    line += " | attestd max RSS %d kB | attacker reconnects %d, sockets at end %d" % (max(rss) if rss else 0, attack.reopened, len(attack.socks))
    print(line, flush=True)
    time.sleep(2)   # the server reaps what the attack left before the next one
