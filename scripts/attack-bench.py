#!/usr/bin/env python3
"""Attacks a running attestd the way issue 10 describes, while a legitimate client sends one
GET /healthz a second on a new connection; prints how many were served, their p50/p99 and
attestd's peak RSS. Attackers connect from 200 loopback addresses (127.0.1.2-201).

usage: scripts/attack-bench.py PORT MODE CONNECTIONS SECONDS [ATTESTD_PID]
  MODE head:   a partial request head, one more byte every 5 s (reconnecting when cut)
  MODE body:   a token request whose 60,000-byte body arrives one byte every 5 s
  MODE noread: PIPELINE (default 50) pipelined requests per connection, responses never read
e.g. .build/release/attestd serve --listen 127.0.0.1:8090 & scripts/attack-bench.py 8090 head 5000 30 $!"""
import socket, sys, time, threading, selectors, os
port, mode, count, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
pid = int(sys.argv[5]) if len(sys.argv) > 5 else None
socks = []
stop = time.time() + seconds
reopened = [0]
def open_one(i):
    src = "127.0.%d.%d" % (1 + (i % 200) // 250, 2 + (i % 200) % 250)
    s = socket.socket(); s.setblocking(True); s.settimeout(2)
    try:
        s.bind((src, 0)); s.connect(("127.0.0.1", port))
        if mode == "head": s.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        elif mode == "body": s.send(b"POST /v1/oauth/token HTTP/1.1\r\nHost: a\r\nContent-Length: 60000\r\n\r\n")
        elif mode == "noread":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            s.send((b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n" if os.environ.get("ROUTE") != "metrics" else b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n") * int(os.environ.get("PIPELINE", "50")))
        s.setblocking(False)
        return s
    except Exception:
        s.close(); return None
def attacker():
    global socks
    for i in range(count):
        s = open_one(i)
        if s: socks.append(s)
    while time.time() < stop:
        time.sleep(5 if mode != "noread" else 1)
        alive = []
        for i, s in enumerate(socks):
            try:
                if mode in ("head", "body"): s.send(b"x")
                alive.append(s)
            except Exception:
                s.close()
                n = open_one(i)   # the attacker reconnects what the server closed
                if n: alive.append(n); reopened[0] += 1
        socks = alive
threading.Thread(target=attacker, daemon=True).start()
time.sleep(2)
lat = []; ok = 0; total = 0
rss = []
while time.time() < stop:
    t = time.time(); total += 1
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            d = c.recv(4096)
            if not d: break
            data += d
        c.close()
        if data.startswith(b"HTTP/1.1 200"): ok += 1; lat.append(time.time() - t)
    except Exception as e:
        pass
    if pid:
        try: rss.append(int(open("/proc/%d/status" % pid).read().split("VmRSS:")[1].split()[0]))
        except Exception: pass
    time.sleep(max(0, 1 - (time.time() - t)))
lat.sort()
p99 = lat[min(len(lat)-1, int(len(lat)*0.99))] * 1000 if lat else float('nan')
print("latencies ms:", [round(x*1000,1) for x in lat][-5:], "max", round(max(lat)*1000,1) if lat else 0); print(f"{mode} x{count}: healthz served {ok}/{total}, p50 {lat[len(lat)//2]*1000 if lat else float('nan'):.1f} ms, p99 {p99:.1f} ms, max RSS {max(rss) if rss else 0} kB, attacker reconnects {reopened[0]}, attacker sockets at end {len(socks)}")
