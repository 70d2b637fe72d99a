"""A webhook receiver for the budget-alert tests: checks every delivery's signature the way an
operator's receiver would, and logs what it saw, one JSON object per line.

    webhook_receiver.py --secret-file FILE [--fail-first N] [--fail-while-exists FILE] --log FILE

Prints `PORT n` once it listens (plain HTTP on 127.0.0.1). The secret is read from its file at
each request: the test writes it after `attestctl webhooks add` printed it. It answers 503 to
the first N deliveries, and while the file named by --fail-while-exists exists; 200 otherwise.
"""
import argparse
import hashlib
import hmac
import http.server
import json
import os
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--secret-file", required=True)
parser.add_argument("--fail-first", type=int, default=0)
parser.add_argument("--fail-while-exists")
parser.add_argument("--log", required=True)
args = parser.parse_args()
lock = threading.Lock()
seen = {"count": 0}


def signature_ok(header, body):
    """t=UNIX,v1=HEX: the HMAC-SHA256 of "UNIX." followed by the body, under the secret."""
    try:
        with open(args.secret_file, "rb") as f:
            secret = f.read().strip()
    except OSError:
        return False, None
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    if "t" not in parts or "v1" not in parts:
        return False, None
    expected = hmac.new(secret, parts["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"]), int(parts["t"])


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        ok, timestamp = signature_ok(self.headers.get("x-attestd-signature", ""), body)
        with lock:
            seen["count"] += 1
            failing = seen["count"] <= args.fail_first or (args.fail_while_exists and os.path.exists(args.fail_while_exists))
            status = 503 if failing else 200
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            entry = {"path": self.path, "event": self.headers.get("x-attestd-event"), "delivery": self.headers.get("x-attestd-delivery"),
                     "content_type": self.headers.get("content-type"), "signature_ok": ok,
                     "timestamp_skew": None if timestamp is None else abs(time.time() - timestamp), "answered": status, "body": parsed}
            with open(args.log, "a") as f:
                f.write(json.dumps(entry) + "\n")
        reply = b'{"ok":true}' if status == 200 else b'{"error":"try later"}'
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *_):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"PORT {server.server_address[1]}", flush=True)
server.serve_forever()
