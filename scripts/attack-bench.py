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
    noread: PIPELINE (default 50) pipelined requests per connection, responses never read; ROUTE=healthz
            (default), metrics (404 on the public listener) or challenge (POST /v1/oauth/app-attest/challenge)
            says which; RCVBUF (default 1024) is each attacking socket's receive buffer, 0 the kernel's
            default (128 KiB here, which takes every answer of a 200-deep pipeline: nothing waits unsent)
    head1:  the slow heads of "head", all from one address (the per-address limit's case)
    flood:  challenge requests as fast as FLOOD_THREADS (default 48) threads can send them, each
            from a new address (127.1.0.1 upward; CONNECTIONS is ignored): the rate limiter must
            not lock a new caller out
  CLIENT_ID=clid_… enables the exchange: an integration for APP_ID (default
  ABCDE12345.com.example.app) on a server started with --trust-anchor Fixtures/test-authority/root.pem.
  ATTEST_SIM is the attest-sim binary (default .build/release/attest-sim, else .build/debug/attest-sim).
  The exchange's time is attest-sim's own (exchange_ms: its start-up left out, the device's key
  generation and signing in); its time with no attack is printed first.
e.g. .build/release/attestd serve --listen 127.0.0.1:8090 --trust-anchor Fixtures/test-authority/root.pem &
     CLIENT_ID=clid_… scripts/attack-bench.py 8090 all 5000 30 $!"""
import json, os, shutil, socket, subprocess, sys, tempfile, threading, time

if len(sys.argv) < 5:
    sys.exit(__doc__)
port, modes, count, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
pid = int(sys.argv[5]) if len(sys.argv) > 5 else None
modes = ["head", "body", "noread", "head1", "flood"] if modes == "all" else modes.split(",")
client_id = os.environ.get("CLIENT_ID")
app_id = os.environ.get("APP_ID", "ABCDE12345.com.example.app")
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
attest_sim = os.environ.get("ATTEST_SIM") or next(
    (p for p in (os.path.join(root, ".build", b, "attest-sim") for b in ("release", "debug")) if os.path.exists(p)), None)
if client_id and not attest_sim:
    sys.exit("no attest-sim binary: build it or set ATTEST_SIM")


def noread_request():
    route = os.environ.get("ROUTE", "healthz")
    if route == "challenge":
        body = json.dumps({"client_id": client_id or "clid_flood", "key_id": "A" * 43 + "="}).encode()
        return (b"POST /v1/oauth/app-attest/challenge HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body)) + body
    return b"GET /%s HTTP/1.1\r\nHost: a\r\n\r\n" % route.encode()


NOREAD_REQUEST = None
NOREAD_RCVBUF = int(os.environ.get("RCVBUF", "1024"))


def open_one(mode, i):
    src = "127.0.%d.%d" % (1 + (i % 200) // 250, 2 + (i % 200) % 250) if mode != "head1" else "127.0.1.2"
    if mode == "head1": mode = "head"
    s = socket.socket(); s.setblocking(True); s.settimeout(2)
    try:
        s.bind((src, 0)); s.connect(("127.0.0.1", port))
        if mode == "head": s.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        elif mode == "body": s.send(b"POST /v1/oauth/token HTTP/1.1\r\nHost: a\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 60000\r\n\r\n")
        elif mode == "noread":
            if NOREAD_RCVBUF > 0: s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, NOREAD_RCVBUF)
            s.setblocking(False)
            data = NOREAD_REQUEST * int(os.environ.get("PIPELINE", "50"))
            try: s.send(data)   # what the socket takes now; the rest is the attacker's loss
            except BlockingIOError: pass
        else:
            sys.exit("unknown mode %s" % mode)
        s.setblocking(False)
        return s
    except OSError:
        s.close(); return None


class Flood:
    """Challenge requests, each from an address not used before, until stop()."""
    def __init__(self):
        self.running, self.next, self.lock, self.statuses = True, 0, threading.Lock(), {}
        self.socks, self.reopened = [], 0
        body = json.dumps({"client_id": client_id or "clid_flood", "key_id": "A" * 43 + "="}).encode()
        self.request = (b"POST /v1/oauth/app-attest/challenge HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(int(os.environ.get("FLOOD_THREADS", "48")))]
        for t in self.threads: t.start()

    def run(self):
        while self.running:
            with self.lock:
                i = self.next; self.next += 1
            src = "127.%d.%d.%d" % (1 + i // 65025 % 250, i // 255 % 255, 1 + i % 255)
            status = "error"
            try:
                s = socket.socket(); s.settimeout(5); s.bind((src, 0)); s.connect(("127.0.0.1", port)); s.sendall(self.request)
                head = s.recv(64); s.close()
                status = head[9:12].decode(errors="replace") or "closed"
            except OSError:
                pass
            with self.lock:
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def stop(self):
        self.running = False
        for t in self.threads: t.join(10)
        print("  flood: %d addresses, answers %s" % (self.next, dict(sorted(self.statuses.items()))), flush=True)


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
                    if self.mode in ("head", "head1", "body"): s.send(b"x")
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
    """A fresh install's whole exchange through the published client's logic: its time in seconds
    as the device measured it (attest-sim's start-up left out), or None if it did not register."""
    state = tempfile.mkdtemp(prefix="attack-bench-device-")
    try:
        done = subprocess.run([attest_sim, "simulate-device", "--base-url", "http://127.0.0.1:%d" % port, "--client-id", client_id,
                               "--state-dir", state, "--app-id", app_id], capture_output=True, timeout=15)
        line = json.loads(done.stdout.decode(errors="replace").split("\n")[0])
        if done.returncode != 0 or line.get("source") != "registered": return None
        return line["exchange_ms"] / 1000.0
    except (subprocess.TimeoutExpired, ValueError, KeyError):
        return None
    finally:
        shutil.rmtree(state, ignore_errors=True)


def timed(call, latencies):
    """Runs call; a call that returns its own duration (a float) is timed by it, else by the wall clock."""
    t = time.time()
    try:
        ok = call()
    except OSError:
        ok = False
    if ok is None or ok is False: return False
    latencies.append(ok if isinstance(ok, float) else time.time() - t)
    return True


def summary(name, ok, total, lat):
    lat = sorted(lat)
    if not lat: return "%s %d/%d" % (name, ok, total)
    p50, p99 = lat[len(lat) // 2] * 1000, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    return "%s %d/%d (%.0f%%), p50 %.1f ms, p99 %.1f ms, max %.1f ms" % (name, ok, total, 100.0 * ok / total, p50, p99, lat[-1] * 1000)


def cpu_seconds():
    """attestd's CPU time so far (user and system), 0 without its process ID."""
    try: fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    except (OSError, TypeError, IndexError): return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb():
    try: return int(open("/proc/%d/status" % pid).read().split("VmRSS:")[1].split()[0])
    except (OSError, IndexError, ValueError): return 0


NOREAD_REQUEST = noread_request()

if client_id:
    base = []
    for _ in range(3): timed(exchange, base)
    print(summary("exchange without attack:", len(base), 3, base), flush=True)

for mode in modes:
    cpu_before = cpu_seconds()
    attack = Flood() if mode == "flood" else Attack(mode)
    time.sleep(2)
    stop = time.time() + seconds
    health, health_ok, trade, trade_ok, rss, total, slow = [], 0, [], 0, [], 0, []
    began = time.time()
    while time.time() < stop:
        t = time.time(); total += 1
        health_ok += timed(healthz, health)
        if client_id: trade_ok += timed(exchange, trade)
        # When in the attack the slow answers came (seconds since the measuring began).
        if health and health[-1] > 0.1: slow.append("healthz %.0f ms at %.0f s" % (health[-1] * 1000, t - began))
        if trade and trade[-1] > 0.1: slow.append("exchange %.0f ms at %.0f s" % (trade[-1] * 1000, t - began))
        if pid: rss.append(rss_kb())
        time.sleep(max(0, 1 - (time.time() - t)))
    attack.stop()
    line = "%s x%d, %g s: %s" % (mode, count if mode != "flood" else attack.next, seconds, summary("healthz", health_ok, total, health))
    if client_id: line += " | " + summary("exchange", trade_ok, total, trade)
    line += " | attestd max RSS %d kB, CPU %.1f s | attacker reconnects %d, sockets at end %d" % (
        max(rss) if rss else 0, cpu_seconds() - cpu_before, attack.reopened, len(attack.socks))
    print(line, flush=True)
    if slow: print("  over 100 ms: " + ", ".join(slow), flush=True)
    time.sleep(2)   # the server reaps what the attack left before the next one
