#!/usr/bin/env python3
"""End-to-end check of bedrock_stub.py and vertex_stub.py, without the Swift code.

Makes a throwaway CA and server certificate (openssl CLI) and an RSA service-account key, starts
a small fake Anthropic Messages API in this process and the stubs as subprocesses, and drives
them over TLS: SigV4 requests signed with botocore, JWT assertions signed with cryptography,
with the refusals each stub must make. Exits 1 on any failure.

    .venv/bin/python Tests/Support/cloud-stubs/selfcheck.py [-v] [--keep]
"""

import base64
import hashlib
import hmac
import http.client
import http.server
import json
import os
import select
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from datetime import datetime, timedelta, timezone
from urllib.parse import urlencode

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

HERE = os.path.dirname(os.path.abspath(__file__))
VERBOSE = "-v" in sys.argv
KEEP = "--keep" in sys.argv  # keep the temporary directory (certificates, logs) even on success

FAKE_KEY = "test-key-fake-selfcheck"
AKID = "AKIDSELFCHECK0000001"
SECRET = "selfcheck/secret+KEY0000000000000000000000"
SESSION = "IQoJb3JpZ2luX2VjEselfchecksessiontoken=="
REGION = "us-east-1"
PROJECT = "selfcheck-project"
VREGION = "us-east5"
CLIENT_EMAIL = "relay@selfcheck-project.iam.gserviceaccount.com"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
SUFFIX = ":http://internal.amazon.com/coral/com.amazon.bedrock/"


# MARK: Bookkeeping


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def check(self, condition, name, detail=""):
        if condition:
            self.passed += 1
            if VERBOSE:
                print(f"  ok   {name}")
        else:
            self.failed.append(name)
            print(f"  FAIL {name}" + (f": {detail}" if detail != "" else ""))
        return condition

    def equal(self, actual, expected, name):
        return self.check(actual == expected, name, f"expected {expected!r}, got {actual!r}")


CHECKS = Checks()
check = CHECKS.check
equal = CHECKS.equal


def section(title, function, *args):
    print(f"- {title}")
    try:
        function(*args)
    except Exception:
        CHECKS.failed.append(f"{title}: exception")
        traceback.print_exc()


def wait_until(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


# MARK: Keys and certificates


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_pki(directory):
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ca.key", cwd=directory)
    openssl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=cloud-stubs selfcheck CA", "-days", "2",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-out", "ca.pem", cwd=directory)
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "server.key", cwd=directory)
    openssl("req", "-new", "-key", "server.key", "-subj", "/CN=127.0.0.1", "-out", "server.csr", cwd=directory)
    with open(os.path.join(directory, "server.ext"), "w") as f:
        f.write("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-extfile", "server.ext", "-out", "server.pem", cwd=directory)


def make_service_account(directory):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with open(os.path.join(directory, "sa-public.pem"), "wb") as f:
        f.write(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with open(os.path.join(directory, "sa.json"), "w") as f:
        json.dump({"type": "service_account", "project_id": PROJECT, "private_key_id": "selfcheck",
                   "private_key": pem.decode(), "client_email": CLIENT_EMAIL, "token_uri": "https://127.0.0.1/token"}, f)
    return key


# MARK: The fake Anthropic Messages API


def sse(name, data):
    return f"event: {name}\ndata: {data}\n\n".encode("utf-8")


STREAM_EVENTS = [
    ("message_start", '{"type":"message_start","message":{"id":"msg_fake1","type":"message","role":"assistant","model":"M",'
                      '"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}}'),
    ("content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'),
    ("ping", '{"type": "ping"}'),
    ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Bonjour, "}}'),
    ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ça va?\\n"}}'),
    ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"✓ \\u00e9"}}'),
    ("content_block_stop", '{"type":"content_block_stop","index":0}'),
    ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}'),
    ("message_stop", '{"type":"message_stop"}'),
]


def stream_pieces(model):
    """The chunks the fake sends: one event each, one split in two, and a comment line. A model
    whose name holds `cache` reports 5 tokens written to the cache and 7 read from it."""
    events = [(n, d.replace('"model":"M"', '"model":' + json.dumps(model))) for n, d in STREAM_EVENTS]
    if "cache" in model:
        events[0] = (events[0][0], events[0][1].replace('"input_tokens":12,', '"input_tokens":12,"cache_creation_input_tokens":5,'
                                                                            '"cache_read_input_tokens":7,'))
    pieces = [sse(*events[0]), b": a comment the stubs skip\n\n"]
    second = sse(*events[1])
    pieces += [second[:17], second[17:]]
    pieces += [sse(*e) for e in events[2:]]
    return pieces, [d.encode("utf-8") for _, d in events]


def whole_body(model):
    # Spaces, key order and an escape that json.dumps would write differently: the stubs must keep the bytes.
    return ('{"id": "msg_fake0", "type":"message","role":"assistant", "model":' + json.dumps(model) +
            ',"content":[{"type":"text","text":"h\\u00e9llo — fine"}],"stop_reason":"end_turn","stop_sequence":null,'
            '"usage":{"input_tokens":17,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":5}}').encode("utf-8")


class Fake:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = []  # dicts: path, headers (lower -> [values]), body (parsed), sent (bytes), client_left
        handler = self.make_handler()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def count(self):
        with self.lock:
            return len(self.requests)

    def since(self, n):
        with self.lock:
            return list(self.requests[n:])

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def make_handler(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def error(self, status, kind, message, extra=()):
                body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
                self.record["sent"] = body  # before the client can see it
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("request-id", "req_fake")
                for name, value in extra:
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return body

            def pause(self, seconds):
                """Sleep, or return False as soon as the client has closed (as the Swift stub notices)."""
                ready, _, _ = select.select([self.connection], [], [], seconds)
                if ready:
                    try:
                        return self.connection.recv(1, socket.MSG_PEEK) != b""
                    except OSError:
                        return False
                return True

            def chunk(self, data):
                self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
                self.wfile.flush()

            def do_POST(self):
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                headers = {}
                for name, value in self.headers.items():
                    headers.setdefault(name.lower(), []).append(value)
                record = {"path": self.path, "headers": headers, "raw": raw, "sent": b"", "client_left": False}
                self.record = record
                try:
                    record["body"] = json.loads(raw)
                except ValueError:
                    record["body"] = None
                with fake.lock:
                    fake.requests.append(record)
                if self.path not in ("/v1/messages", "/v1/messages/count_tokens"):
                    record["sent"] = self.error(404, "not_found_error", "no such path")
                    return
                if headers.get("authorization"):
                    record["sent"] = self.error(400, "invalid_request_error", "Authorization must not reach the API")
                    return
                if headers.get("x-api-key") != [FAKE_KEY]:
                    record["sent"] = self.error(401, "authentication_error", "invalid x-api-key")
                    return
                if not headers.get("anthropic-version"):
                    record["sent"] = self.error(400, "invalid_request_error", "anthropic-version: header is required")
                    return
                body = record["body"] or {}
                model = body.get("model", "")
                if "status-" in model:
                    status = int(model.split("status-")[1][:3])
                    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                             404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}
                    extra = [("retry-after", "3")] if status == 429 else []
                    record["sent"] = self.error(status, kinds.get(status, "api_error"), f"fake says {status}", extra)
                    return
                if self.path == "/v1/messages/count_tokens":
                    data = json.dumps({"input_tokens": 42}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    record["sent"] = data
                    return
                if not body.get("stream"):
                    data = whole_body(model)
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    record["sent"] = data
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("cache-control", "no-cache")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                pieces, _ = stream_pieces(model)
                slow = "slow" in model
                try:
                    for i, piece in enumerate(pieces):
                        if "break" in model and i == 4:
                            self.close_connection = True
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        if slow and i >= 3 and not self.pause(0.3):
                            record["client_left"] = True
                            self.close_connection = True
                            return
                        self.chunk(piece)
                        record["sent"] += piece
                        if slow and i >= 3:
                            for _ in range(20):
                                if not self.pause(0.3):
                                    record["client_left"] = True
                                    self.close_connection = True
                                    return
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    record["client_left"] = True
                    self.close_connection = True

        return Handler


# MARK: Stubs


class Stub:
    def __init__(self, name, script, args, directory):
        self.name = name
        self.log_path = os.path.join(directory, f"{name}.jsonl")
        self.stderr_path = os.path.join(directory, f"{name}.stderr")
        self.stderr = open(self.stderr_path, "w")
        self.process = subprocess.Popen([sys.executable, os.path.join(HERE, script), *args, "--log", self.log_path],
                                        stdout=subprocess.PIPE, stderr=self.stderr, stdin=subprocess.DEVNULL)
        ready, _, _ = select.select([self.process.stdout], [], [], 20)
        line = self.process.stdout.readline().decode() if ready else ""
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"{name} did not announce its port (got {line!r}); stderr: {open(self.stderr_path).read()}")
        self.port = int(line.split()[1])

    def log(self):
        try:
            with open(self.log_path) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr.close()
        return self.process.returncode


def client_context(directory):
    return ssl.create_default_context(cafile=os.path.join(directory, "ca.pem"))


def https(ctx, port, method, path, body=b"", headers=None, conn=None):
    own = conn is None
    conn = conn or http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=15)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, response.headers, data
    finally:
        if own:
            conn.close()


# MARK: Event-stream decoding (independent of the stub's encoder)


class FrameError(Exception):
    pass


def decode_frames(data, limit=16 * 1024 * 1024):
    frames = []
    at = 0
    while at < len(data):
        if len(data) - at < 12:
            raise FrameError("truncated")
        total, hlen, prelude_crc = struct.unpack(">III", data[at:at + 12])
        if zlib.crc32(data[at:at + 8]) != prelude_crc:
            raise FrameError("prelude-crc")
        if total > limit:
            raise FrameError("oversized")
        if total < 16 or hlen > total - 16:
            raise FrameError("headers-past-frame")
        if len(data) - at < total:
            raise FrameError("truncated")
        message = data[at:at + total]
        if zlib.crc32(message[:-4]) != struct.unpack(">I", message[-4:])[0]:
            raise FrameError("message-crc")
        headers, h = {}, 12
        while h < 12 + hlen:
            n = message[h]
            name = message[h + 1:h + 1 + n].decode()
            h += 1 + n
            if message[h] != 7:
                raise FrameError(f"header type {message[h]}")
            vlen = struct.unpack(">H", message[h + 1:h + 3])[0]
            headers[name] = message[h + 3:h + 3 + vlen].decode()
            h += 3 + vlen
        frames.append((headers, message[12 + hlen:-4]))
        at += total
    return frames


def chunk_bytes(frame):
    headers, payload = frame
    assert headers == {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}, headers
    body = json.loads(payload)
    assert set(body) == {"bytes", "p"}, body
    return base64.b64decode(body["bytes"], validate=True)


# MARK: SigV4 on the client side


def sign(request, *, secret=SECRET, akid=AKID, token=SESSION, region=REGION, service="bedrock", when=None):
    """Signs `request` in place with botocore's SigV4Auth at `when` (default: now)."""
    when = when or datetime.now(timezone.utc)
    request.context["timestamp"] = when.strftime("%Y%m%dT%H%M%SZ")
    request.headers["X-Amz-Date"] = request.context["timestamp"]
    if token:
        request.headers["X-Amz-Security-Token"] = token
    signer = SigV4Auth(Credentials(akid, secret, token), service, region)
    canonical = signer.canonical_request(request)
    signature = signer.signature(signer.string_to_sign(request, canonical), request)
    signed = signer.signed_headers(signer.headers_to_sign(request))
    request.headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={signer.scope(request)}, "
                                        f"SignedHeaders={signed}, Signature={signature}")
    return canonical


def hand_signature(method, path, headers, body, when, secret=SECRET, region=REGION):
    """SigV4 written out by hand (no botocore): to sign headers botocore would leave out."""
    names = sorted(headers)
    canonical = "\n".join([method, path.replace("%", "%25"), "",
                           "".join(f"{n}:{' '.join(headers[n].split())}\n" for n in names),
                           ";".join(names), hashlib.sha256(body).hexdigest()])
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    scope = f"{stamp[:8]}/{region}/bedrock/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (stamp[:8], region, "bedrock", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return ";".join(names), hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), canonical


class Bedrock:
    def __init__(self, ctx, stub, token=SESSION):
        self.ctx, self.stub, self.token = ctx, stub, token

    def request(self, model_raw, body, *, stream=False, sign_path=None, send_body=None, conn=None,
                extra_unsigned=None, path=None, host=None, signed_headers=None, **signing):
        """Signs and sends; `path` replaces the InvokeModel one, `host` is the Host signed and sent
        (default 127.0.0.1:PORT), `signed_headers` more headers to sign."""
        operation = "invoke-with-response-stream" if stream else "invoke"
        path = path or f"/model/{model_raw}/{operation}"
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        authority = host or f"127.0.0.1:{self.stub.port}"
        request = AWSRequest(method="POST", url=f"https://{authority}{sign_path or path}", data=data,
                             headers={"Content-Type": "application/json",
                                      "Accept": "application/vnd.amazon.eventstream" if stream else "application/json",
                                      **(signed_headers or {})})
        signing.setdefault("token", self.token)
        sign(request, **signing)
        headers = dict(request.headers.items())
        if host:
            headers["Host"] = host
        headers.update(extra_unsigned or {})
        return https(self.ctx, self.stub.port, "POST", path, send_body if send_body is not None else data, headers, conn)


def bedrock_body(**extra):
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64,
            "messages": [{"role": "user", "content": "Bonjour"}]}
    body.update(extra)
    return body


# MARK: JWT on the client side


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_jwt(key, claims, header=None):
    header = header or {"alg": "RS256", "typ": "JWT", "kid": "selfcheck"}
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{b64url(signature)}"


def claims_for(port, **changes):
    now = int(time.time())
    claims = {"iss": CLIENT_EMAIL, "scope": CLOUD_PLATFORM, "aud": f"https://127.0.0.1:{port}/token",
              "iat": now, "exp": now + 3600}
    claims.update(changes)
    return claims


def grant(ctx, port, assertion):
    form = urlencode({"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer", "assertion": assertion}).encode()
    status, headers, data = https(ctx, port, "POST", "/token", form,
                                  {"Content-Type": "application/x-www-form-urlencoded"})
    return status, json.loads(data) if data else None


def vertex_path(model_raw, method="rawPredict", project=PROJECT, region=VREGION):
    return f"/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model_raw}:{method}"


def vertex_body(**extra):
    body = {"anthropic_version": "vertex-2023-10-16", "max_tokens": 64,
            "messages": [{"role": "user", "content": "Bonjour"}]}
    body.update(extra)
    return body


# MARK: Cancelling a stream by hanging up


def cancel_after_first_bytes(ctx, port, path, headers, body):
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head += f"Content-Length: {len(body)}\r\n\r\n"
    tls.sendall(head.encode() + body)
    received = b""
    while b"\r\n\r\n" not in received or len(received.split(b"\r\n\r\n", 1)[1]) < 40:
        piece = tls.recv(65536)
        if not piece:
            break
        received += piece
    tls.shutdown(socket.SHUT_RDWR)  # a hang-up (TCP, no close_notify), as a cancelling client does
    tls.close()
    return received


# MARK: Bedrock checks


def bedrock_checks(ctx, fake, stub, plain_stub):
    br = Bedrock(ctx, stub)
    model_raw = "anthropic.claude-x-v1%3A0"

    # The path the stub canonicalises is encoded once more.
    request = AWSRequest(method="POST", url=f"https://127.0.0.1:{stub.port}/model/{model_raw}/invoke", data=b"{}")
    canonical = sign(request)
    equal(canonical.split("\n")[1], "/model/anthropic.claude-x-v1%253A0/invoke", "botocore double-encodes %3A in the canonical URI")
    equal(canonical.split("\n")[-2], "host;x-amz-date;x-amz-security-token", "botocore adds host to the signed headers itself")
    names, _, hand_canonical = hand_signature("POST", f"/model/{model_raw}/invoke",
                                              {"host": f"127.0.0.1:{stub.port}", "x-amz-date": request.context["timestamp"],
                                               "x-amz-security-token": SESSION}, b"{}",
                                              datetime.strptime(request.context["timestamp"], "%Y%m%dT%H%M%SZ"))
    equal(hand_canonical, canonical, "the hand-written SigV4 agrees with botocore")

    # invoke
    n = fake.count()
    status, headers, data = br.request(model_raw, bedrock_body(anthropic_beta=["context-1m-2025-08-07", "interleaved-thinking-2025-05-14"],
                                                               temperature=0.5))
    equal(status, 200, "invoke: 200")
    seen = fake.since(n)
    if check(len(seen) == 1, "invoke: forwarded once", seen):
        up = seen[0]
        equal(data, up["sent"], "invoke: the Anthropic JSON bytes unchanged")
        equal(up["path"], "/v1/messages", "invoke: upstream path")
        equal(up["body"], {"model": "anthropic.claude-x-v1:0", "max_tokens": 64, "temperature": 0.5,
                           "messages": [{"role": "user", "content": "Bonjour"}]}, "invoke: upstream body")
        equal(up["headers"].get("anthropic-beta"), ["context-1m-2025-08-07,interleaved-thinking-2025-05-14"], "invoke: anthropic-beta header")
        equal(up["headers"].get("anthropic-version"), ["2023-06-01"], "invoke: anthropic-version header")
        equal(up["headers"].get("x-api-key"), [FAKE_KEY], "invoke: x-api-key")
        check("authorization" not in up["headers"] and "x-amz-security-token" not in up["headers"],
              "invoke: no AWS credential upstream", up["headers"])
    equal(headers.get("content-type"), "application/json", "invoke: content-type")
    check(len(headers.get("x-amzn-RequestId", "")) == 36, "invoke: x-amzn-RequestId", headers.get("x-amzn-RequestId"))
    equal((headers.get("X-Amzn-Bedrock-Input-Token-Count"), headers.get("X-Amzn-Bedrock-Output-Token-Count")),
          ("17", "5"), "invoke: token count headers")

    # botocore's own add_auth (what an AWS SDK runs), and an inference-profile ARN, '/' encoded as %2F
    arn_raw = "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-x-v1%3A0"
    request = AWSRequest(method="POST", url=f"https://127.0.0.1:{stub.port}/model/{arn_raw}/invoke",
                         data=json.dumps(bedrock_body()).encode(), headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(AKID, SECRET, SESSION), "bedrock", REGION).add_auth(request)
    n = fake.count()
    status = https(ctx, stub.port, "POST", f"/model/{arn_raw}/invoke", request.body, dict(request.headers.items()))[0]
    equal(status, 200, "add_auth-signed request with an ARN model id: 200")
    equal([r["body"].get("model") for r in fake.since(n)],
          ["arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-x-v1:0"], "ARN model id decoded once")

    # keep-alive: two requests on one connection
    conn = http.client.HTTPSConnection("127.0.0.1", stub.port, context=ctx, timeout=15)
    first = br.request(model_raw, bedrock_body(), conn=conn)[0]
    sock = conn.sock
    second = br.request(model_raw, bedrock_body(), conn=conn)[0]
    check(first == second == 200 and conn.sock is sock and sock is not None, "keep-alive: two invokes on one connection")
    conn.close()

    # invoke-with-response-stream
    n = fake.count()
    status, headers, data = br.request(model_raw, bedrock_body(), stream=True)
    equal(status, 200, "stream: 200")
    equal(headers.get("content-type"), "application/vnd.amazon.eventstream", "stream: content-type")
    equal(headers.get("X-Amzn-Bedrock-Content-Type"), "application/json", "stream: X-Amzn-Bedrock-Content-Type")
    _, expected = stream_pieces("anthropic.claude-x-v1:0")
    try:
        frames = decode_frames(data)
        chunks = [chunk_bytes(f) for f in frames]
        equal(chunks[:-1], expected[:-1], "stream: one chunk per SSE event, data bytes exact (ping included)")
        stop = json.loads(chunks[-1])
        equal((stop["type"], stop["usage"]), ("message_stop", {"input_tokens": 12, "cache_creation_input_tokens": 0,
                                                                "cache_read_input_tokens": 0, "output_tokens": 3}),
              "stream: message_stop carries the usage")
        metrics = stop.get("amazon-bedrock-invocationMetrics") or {}
        equal({k: metrics.get(k) for k in ("inputTokenCount", "outputTokenCount", "cacheReadInputTokenCount", "cacheWriteInputTokenCount")},
              {"inputTokenCount": 12, "outputTokenCount": 3, "cacheReadInputTokenCount": 0, "cacheWriteInputTokenCount": 0},
              "stream: message_stop carries amazon-bedrock-invocationMetrics")
        check(all(type(metrics.get(k)) is int and metrics[k] >= 0 for k in ("invocationLatency", "firstByteLatency")),
              "stream: invocation and first-byte latency in ms", metrics)
    except (FrameError, AssertionError, ValueError, KeyError, IndexError) as error:
        check(False, "stream: frames decode", repr(error))
    seen = fake.since(n)
    if check(len(seen) == 1, "stream: forwarded once"):
        equal(seen[0]["body"].get("stream"), True, "stream: upstream body has stream: true")
        equal(seen[0]["body"].get("model"), "anthropic.claude-x-v1:0", "stream: upstream model")

    # Signature refusals
    def refused(result, error_type, name):
        status, headers, data = result
        equal((status, headers.get("x-amzn-ErrorType")), (403, error_type), name)
        try:
            check("message" in json.loads(data), f"{name}: body has a message", data)
        except ValueError:
            check(False, f"{name}: JSON body", data)

    n = fake.count()
    refused(br.request(model_raw, bedrock_body(), secret=SECRET + "x"), "InvalidSignatureException", "wrong secret: 403")
    refused(br.request(model_raw, bedrock_body(), akid="AKIDSOMEONEELSE00000"), "UnrecognizedClientException", "unknown key id: 403")
    refused(br.request(model_raw, bedrock_body(), send_body=json.dumps(bedrock_body(max_tokens=65)).encode()),
            "InvalidSignatureException", "tampered body: 403")
    refused(br.request(model_raw, bedrock_body(), when=datetime.now(timezone.utc) - timedelta(minutes=20)),
            "InvalidSignatureException", "stale date: 403")
    refused(br.request(model_raw, bedrock_body(), when=datetime.now(timezone.utc) + timedelta(minutes=20)),
            "InvalidSignatureException", "date in the future: 403")
    refused(br.request(model_raw, bedrock_body(), region="eu-west-1"), "InvalidSignatureException", "wrong region: 403")
    refused(br.request(model_raw, bedrock_body(), service="sagemaker"), "InvalidSignatureException", "wrong service: 403")
    refused(br.request(model_raw, bedrock_body(), token=None), "UnrecognizedClientException", "session token missing: 403")
    refused(br.request(model_raw, bedrock_body(), token=SESSION + "x"), "UnrecognizedClientException", "wrong session token: 403")
    refused(br.request(model_raw, bedrock_body(), sign_path="/model/anthropic.claude-x-v1:0/invoke"),
            "InvalidSignatureException", "signed over the unencoded path: 403")
    refused(br.request(model_raw, bedrock_body(), extra_unsigned={"X-Amz-Content-SHA256": "0" * 64}),
            "InvalidSignatureException", "x-amz-content-sha256 not the body's: 403")
    # A signature correct by the SigV4 text, over user-agent, which botocore never signs.
    when = datetime.now(timezone.utc)
    body = json.dumps(bedrock_body()).encode()
    path = f"/model/{model_raw}/invoke"
    signed_headers = {"host": f"127.0.0.1:{stub.port}", "x-amz-date": when.strftime("%Y%m%dT%H%M%SZ"),
                      "x-amz-security-token": SESSION, "user-agent": "selfcheck/1", "content-type": "application/json"}
    names, signature, _ = hand_signature("POST", path, signed_headers, body, when)
    headers = {k: v for k, v in signed_headers.items() if k != "host"}
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={AKID}/{when:%Y%m%d}/{REGION}/bedrock/aws4_request, "
                                f"SignedHeaders={names}, Signature={signature}")
    refused(https(ctx, stub.port, "POST", path, body, headers), "InvalidSignatureException", "user-agent signed: 403")
    # The same by hand without user-agent passes: the hand signer is right, only the header set differs.
    del signed_headers["user-agent"]
    names, signature, _ = hand_signature("POST", path, signed_headers, body, when)
    headers = {k: v for k, v in signed_headers.items() if k != "host"}
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={AKID}/{when:%Y%m%d}/{REGION}/bedrock/aws4_request,"
                                f"SignedHeaders={names},Signature={signature}")
    equal(https(ctx, stub.port, "POST", path, body, headers)[0], 200, "hand-signed without user-agent: 200")
    # host left out of the signed headers
    names, signature, _ = hand_signature("POST", path, {k: v for k, v in signed_headers.items() if k != "host"}, body, when)
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={AKID}/{when:%Y%m%d}/{REGION}/bedrock/aws4_request, "
                                f"SignedHeaders={names}, Signature={signature}")
    refused(https(ctx, stub.port, "POST", path, body, headers), "InvalidSignatureException", "host not signed: 403")
    equal(fake.count() - n, 1, "refused requests are not forwarded (only the hand-signed good one was)")
    time.sleep(0.2)
    reasons = [r.get("reason") or "" for r in stub.log() if r.get("status") == 403]
    check(any("user-agent" in r for r in reasons), "log: the user-agent refusal names the header", reasons)
    check(any("signature mismatch" in r for r in reasons), "log: a mismatch says so", reasons)
    check(any(r.get("canonical_request") for r in stub.log() if r.get("status") == 403), "log: mismatches carry the canonical request")

    # A stub without a session token: tokenless requests pass, a token is refused.
    plain = Bedrock(ctx, plain_stub, token=None)
    equal(plain.request(model_raw, bedrock_body())[0], 200, "no session token configured: unsigned-token request 200")
    refused(plain.request(model_raw, bedrock_body(), token=SESSION), "UnrecognizedClientException",
            "no session token configured, one sent: 403")

    # Body validation
    def invalid(body, name):
        status, headers, data = br.request(model_raw, body)
        equal((status, headers.get("x-amzn-ErrorType")), (400, "ValidationException"), name)
        check("message" in json.loads(data), f"{name}: message", data)

    n = fake.count()
    invalid({k: v for k, v in bedrock_body().items() if k != "anthropic_version"}, "no anthropic_version: 400")
    invalid(bedrock_body(anthropic_version="vertex-2023-10-16"), "wrong anthropic_version: 400")
    invalid(bedrock_body(model="claude"), "model in the body: 400")
    invalid(bedrock_body(stream=True), "stream in the body: 400")
    invalid(bedrock_body(anthropic_beta="not-a-list"), "anthropic_beta not a list: 400")
    invalid(b"{not json", "not JSON: 400")
    equal(fake.count(), n, "invalid bodies are not forwarded")

    # Scripted refusals
    n = fake.count()
    status, headers, _ = br.request("anthropic.throttle-v1%3A0", bedrock_body())
    equal((status, headers.get("x-amzn-ErrorType"), headers.get("retry-after")), (429, "ThrottlingException" + SUFFIX, "7"),
          "throttle: 429 ThrottlingException, retry-after 7")
    status, headers, _ = br.request("anthropic.unavailable-v1", bedrock_body(), stream=True)
    equal((status, headers.get("x-amzn-ErrorType")), (503, "ServiceUnavailableException" + SUFFIX), "unavailable: 503")
    status, headers, _ = br.request("anthropic.not-ready-v1", bedrock_body())
    equal((status, headers.get("x-amzn-ErrorType")), (429, "ModelNotReadyException" + SUFFIX), "not-ready: 429 ModelNotReadyException")
    status, headers, data = br.request("anthropic.claude-too-long-v1", bedrock_body(), stream=True)
    equal((status, headers.get("x-amzn-ErrorType"), json.loads(data).get("message")),
          (400, "ValidationException", "Input is too long for requested model."), "too-long: 400 ValidationException")
    equal(fake.count(), n, "scripted refusals are not forwarded")

    # The Anthropic stub's errors, in Bedrock's names
    for upstream, (status_expected, name) in {400: (400, "ValidationException"), 401: (403, "AccessDeniedException"),
                                              403: (403, "AccessDeniedException"), 404: (404, "ResourceNotFoundException"),
                                              429: (429, "ThrottlingException"), 500: (500, "InternalServerException"),
                                              503: (503, "ServiceUnavailableException"),
                                              529: (503, "ServiceUnavailableException")}.items():
        for stream in (False, True):
            status, headers, data = br.request(f"stub-status-{upstream}", bedrock_body(), stream=stream)
            label = f"upstream {upstream} ({'stream' if stream else 'invoke'}) → {status_expected} {name}"
            equal((status, headers.get("x-amzn-ErrorType"), json.loads(data)), (status_expected, name + SUFFIX,
                                                                                 {"message": f"fake says {upstream}"}), label)
            if upstream == 429:
                equal(headers.get("retry-after"), "3", f"{label}: retry-after copied")

    # midstream-exception
    status, headers, data = br.request("anthropic.midstream-exception-v1", bedrock_body(), stream=True)
    equal(status, 200, "midstream-exception: 200")
    try:
        frames = decode_frames(data)
        equal(len(frames), 4, "midstream-exception: 3 chunks and an exception")
        equal([chunk_bytes(f) for f in frames[:3]], stream_pieces("anthropic.midstream-exception-v1")[1][:3],
              "midstream-exception: the first 3 events")
        equal(frames[3][0], {":exception-type": "throttlingException", ":content-type": "application/json",
                             ":message-type": "exception"}, "midstream-exception: exception headers")
        equal(json.loads(frames[3][1]), {"message": "Too many tokens, please wait before trying again."},
              "midstream-exception: exception payload")
    except (FrameError, AssertionError, ValueError) as error:
        check(False, "midstream-exception: frames decode", repr(error))

    # Malformed frames after two good chunks
    for kind in ("bad-prelude-crc", "bad-message-crc", "truncated-frame", "oversized-frame", "headers-past-frame"):
        status, _, data = br.request(f"anthropic.{kind}-v1", bedrock_body(), stream=True)
        good = 0
        at = 0
        try:
            for _ in range(2):
                total = struct.unpack(">I", data[at:at + 4])[0]
                decode_frames(data[at:at + total])
                at += total
                good += 1
            decode_frames(data[at:])
            outcome = "decoded"
        except FrameError as error:
            outcome = str(error)
        expected_error = {"bad-prelude-crc": "prelude-crc", "bad-message-crc": "message-crc", "truncated-frame": "truncated",
                          "oversized-frame": "oversized", "headers-past-frame": "headers-past-frame"}[kind]
        equal((status, good, outcome), (200, 2, expected_error), f"{kind}: two good frames, then {expected_error}")

    # The upstream's stream breaks: the client sees a cut body.
    conn = http.client.HTTPSConnection("127.0.0.1", stub.port, context=ctx, timeout=15)
    try:
        br.request("stub-break", bedrock_body(), stream=True, conn=conn)
        check(False, "upstream break: the stream is cut short", "the body ended cleanly")
    except http.client.IncompleteRead:
        check(True, "upstream break: the stream is cut short")
    finally:
        conn.close()

    # 413
    conn = http.client.HTTPSConnection("127.0.0.1", stub.port, context=ctx, timeout=15)
    conn.putrequest("POST", f"/model/{model_raw}/invoke")
    conn.putheader("Content-Length", str(9 * 1024 * 1024))
    conn.endheaders()
    response = conn.getresponse()
    equal(response.status, 413, "9 MiB body: 413")
    conn.close()

    # Cancellation: the client hangs up mid-stream, the upstream connection is closed at once.
    n = fake.count()
    request = AWSRequest(method="POST", url=f"https://127.0.0.1:{stub.port}/model/stub-slow/invoke-with-response-stream",
                         data=json.dumps(bedrock_body()).encode(), headers={"Content-Type": "application/json"})
    sign(request)
    started = time.monotonic()
    cancel_after_first_bytes(ctx, stub.port, "/model/stub-slow/invoke-with-response-stream", dict(request.headers.items()),
                             request.body)
    left = wait_until(lambda: fake.since(n) and fake.since(n)[0]["client_left"], 3)
    check(left, "cancel: the Anthropic stub sees the client leave")
    check(time.monotonic() - started < 2.5, "cancel: within a pause of the fake", time.monotonic() - started)
    record = wait_until(lambda: [r for r in stub.log() if r.get("model") == "stub-slow"], 3)
    check(record and record[-1]["cancelled"] is True, "cancel: log says cancelled", record)

    # Unknown route
    status, headers, _ = https(ctx, stub.port, "GET", "/foundation-models")
    equal((status, headers.get("x-amzn-ErrorType")), (404, "UnknownOperationException"), "unknown route: 404")

    # Log lines
    log = stub.log()
    fields = {"path", "status", "verified", "reason", "model", "stream", "cancelled", "body"}
    check(log and all(fields <= set(r) for r in log), "log: every line has the fields", [sorted(r) for r in log[:1]])
    ok = [r for r in log if r.get("status") == 200 and r.get("model") == "anthropic.claude-x-v1:0"]
    check(ok and ok[0]["verified"] is True and ok[0]["body"]["anthropic_version"] == "bedrock-2023-05-31",
          "log: an accepted invoke is verified and carries its body", ok[:1])


# MARK: Vertex checks


def vertex_checks(ctx, fake, stub, short_stub, key):
    port = stub.port
    status, answer = grant(ctx, port, make_jwt(key, claims_for(port)))
    equal(status, 200, "grant: 200")
    token = answer["access_token"] if answer else ""
    check(token.startswith("ya29.stub-") and answer["expires_in"] == 3600 and answer["token_type"] == "Bearer",
          "grant: token shape", answer)
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    status, answer = grant(ctx, port, make_jwt(key, claims_for(port, aud=f"https://localhost:{port}/token",
                                                                 scope="openid " + CLOUD_PLATFORM)))
    equal(status, 200, "grant: localhost audience and a wider scope accepted")

    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    for name, assertion in [
        ("bad signature", make_jwt(other, claims_for(port))),
        ("wrong aud", make_jwt(key, claims_for(port, aud="https://oauth2.googleapis.com/token"))),
        ("wrong scope", make_jwt(key, claims_for(port, scope="https://www.googleapis.com/auth/devstorage.read_only"))),
        ("lifetime over 1 h", make_jwt(key, claims_for(port, exp=now + 3601))),
        ("expired assertion", make_jwt(key, claims_for(port, iat=now - 7200, exp=now - 3600))),
        ("iat in the future", make_jwt(key, claims_for(port, iat=now + 600, exp=now + 1200))),
        ("wrong issuer", make_jwt(key, claims_for(port, iss="someone@else.iam.gserviceaccount.com"))),
        ("float exp", make_jwt(key, claims_for(port, exp=now + 60.5))),
        ("alg HS256", make_jwt(key, claims_for(port), header={"alg": "HS256", "typ": "JWT"})),
        ("two parts", make_jwt(key, claims_for(port)).rsplit(".", 1)[0]),
        ("tampered claims", (lambda j: j.split(".")[0] + "." + b64url(json.dumps(claims_for(port, iss="x")).encode())
                             + "." + j.split(".")[2])(make_jwt(key, claims_for(port)))),
    ]:
        status, answer = grant(ctx, port, assertion)
        equal((status, (answer or {}).get("error")), (400, "invalid_grant"), f"grant refused, {name}: 400 invalid_grant")
        check(bool((answer or {}).get("error_description")), f"grant refused, {name}: says why", answer)
    status, _, data = https(ctx, port, "POST", "/token", urlencode({"grant_type": "password", "assertion": "x"}).encode(),
                            {"Content-Type": "application/x-www-form-urlencoded"})
    equal(status, 400, "grant: other grant_type refused")

    # rawPredict
    n = fake.count()
    headers = dict(auth, **{"anthropic-beta": "context-1m-2025-08-07"})
    status, response_headers, data = https(ctx, port, "POST", vertex_path("claude-sonnet-4%4020250514"),
                                           json.dumps(vertex_body(top_k=3)).encode(), headers)
    equal(status, 200, "rawPredict: 200")
    seen = fake.since(n)
    if check(len(seen) == 1, "rawPredict: forwarded once"):
        equal(data, seen[0]["sent"], "rawPredict: the Anthropic JSON bytes unchanged")
        equal(seen[0]["body"], {"model": "claude-sonnet-4@20250514", "max_tokens": 64, "top_k": 3,
                                "messages": [{"role": "user", "content": "Bonjour"}]}, "rawPredict: upstream body")
        equal(seen[0]["headers"].get("anthropic-beta"), ["context-1m-2025-08-07"], "rawPredict: anthropic-beta passed through")
        check("authorization" not in seen[0]["headers"], "rawPredict: the bearer token stays here")
    equal(response_headers.get("content-type"), "application/json", "rawPredict: content-type")
    check((response_headers.get("request-id") or "").startswith("req_vrtx_"), "rawPredict: a req_vrtx_ request-id",
          response_headers.get("request-id"))

    # streamRawPredict (stream: true in the body is allowed)
    n = fake.count()
    status, response_headers, data = https(ctx, port, "POST", vertex_path("claude-sonnet-4@20250514", "streamRawPredict"),
                                           json.dumps(vertex_body(stream=True)).encode(), auth)
    equal(status, 200, "streamRawPredict: 200")
    seen = fake.since(n)
    if check(len(seen) == 1, "streamRawPredict: forwarded once"):
        equal(data, seen[0]["sent"], "streamRawPredict: SSE bytes unchanged")
        equal(seen[0]["body"].get("stream"), True, "streamRawPredict: stream: true upstream")
        check("anthropic_version" not in seen[0]["body"], "streamRawPredict: anthropic_version removed")
    equal(response_headers.get("content-type"), "text/event-stream; charset=utf-8", "streamRawPredict: content-type")

    # Access token refusals
    n = fake.count()
    for name, headers in [("no Authorization", {"Content-Type": "application/json"}),
                          ("unknown token", {"Authorization": "Bearer ya29.stub-nottoken"}),
                          ("Basic scheme", {"Authorization": f"Basic {token}"})]:
        status, _, data = https(ctx, port, "POST", vertex_path("claude-x"), json.dumps(vertex_body()).encode(), headers)
        equal((status, json.loads(data)["error"]["status"]), (401, "UNAUTHENTICATED"), f"{name}: 401")
    # project and region
    status, _, data = https(ctx, port, "POST", vertex_path("claude-x", project="other"), json.dumps(vertex_body()).encode(), auth)
    equal((status, json.loads(data)["error"]["status"]), (404, "NOT_FOUND"), "other project: 404")
    status, _, data = https(ctx, port, "POST", vertex_path("claude-x", region="europe-west1"), json.dumps(vertex_body()).encode(), auth)
    equal((status, json.loads(data)["error"]["code"]), (404, 404), "other region: 404")
    # body
    for name, body in [("wrong anthropic_version", vertex_body(anthropic_version="bedrock-2023-05-31")),
                       ("no anthropic_version", {"max_tokens": 1, "messages": []}),
                       ("model in the body", vertex_body(model="claude-x"))]:
        status, _, data = https(ctx, port, "POST", vertex_path("claude-x"), json.dumps(body).encode(), auth)
        equal((status, json.loads(data)["error"]["status"]), (400, "INVALID_ARGUMENT"), f"{name}: 400")
    # throttle
    status, _, data = https(ctx, port, "POST", vertex_path("claude-throttle"), json.dumps(vertex_body()).encode(), auth)
    equal((status, json.loads(data)["error"]["status"]), (429, "RESOURCE_EXHAUSTED"), "throttle: 429")
    status, too_long_headers, data = https(ctx, port, "POST", vertex_path("claude-too-long"), json.dumps(vertex_body()).encode(), auth)
    equal((status, json.loads(data)["error"]), (400, {"type": "invalid_request_error",
                                                      "message": "prompt is too long: 208310 tokens > 200000 maximum"}),
          "too-long: the API's own 400")
    check(too_long_headers.get("request-id", "").startswith("req_vrtx_"), "too-long: a req_vrtx_ request-id", too_long_headers)
    equal(fake.count(), n, "refusals are not forwarded")

    # The Anthropic stub's errors pass through unchanged
    n = fake.count()
    status, response_headers, data = https(ctx, port, "POST", vertex_path("stub-status-529", "streamRawPredict"),
                                           json.dumps(vertex_body()).encode(), auth)
    equal((status, data), (529, fake.since(n)[0]["sent"]), "upstream 529: status and body unchanged")
    n = fake.count()
    status, response_headers, data = https(ctx, port, "POST", vertex_path("stub-status-429"), json.dumps(vertex_body()).encode(), auth)
    equal((status, data, response_headers.get("retry-after")), (429, fake.since(n)[0]["sent"], "3"),
          "upstream 429: status, body and retry-after")

    # The upstream stream breaks
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=15)
    try:
        https(ctx, port, "POST", vertex_path("stub-break", "streamRawPredict"), json.dumps(vertex_body()).encode(), auth, conn)
        check(False, "vertex upstream break: cut short", "ended cleanly")
    except http.client.IncompleteRead:
        check(True, "vertex upstream break: cut short")
    finally:
        conn.close()

    # Token endpoint failure switch
    equal(https(ctx, port, "POST", "/_stub/token-endpoint?fail=1")[0], 200, "control: fail=1")
    status, answer = grant(ctx, port, make_jwt(key, claims_for(port)))
    equal((status, answer), (500, {"error": "internal_failure"}), "token endpoint failing: 500 internal_failure")
    https(ctx, port, "POST", "/_stub/token-endpoint?fail=0")
    equal(grant(ctx, port, make_jwt(key, claims_for(port)))[0], 200, "token endpoint back: 200")

    # Cancellation
    n = fake.count()
    cancel_after_first_bytes(ctx, port, vertex_path("stub-slow", "streamRawPredict"), auth, json.dumps(vertex_body()).encode())
    check(wait_until(lambda: fake.since(n) and fake.since(n)[0]["client_left"], 3), "vertex cancel: upstream sees it")
    record = wait_until(lambda: [r for r in stub.log() if r.get("model") == "stub-slow"], 3)
    check(record and record[-1]["cancelled"] is True, "vertex cancel: log says cancelled", record)

    status, _, data = https(ctx, port, "GET", "/_stub/stats")
    stats = json.loads(data)
    equal((stats["grants"], stats["cancelled"]), (3, 1), "stats: grants and cancellations")
    check(stats["requests"] >= 12, "stats: requests counted", stats)
    grants = [r for r in stub.log() if r.get("grant")]
    check(len(grants) >= 15 and all("reason" in r and "verified" in r for r in grants), "log: token requests are marked grant")
    check(any(r["verified"] and r.get("claims", {}).get("iss") == CLIENT_EMAIL for r in grants), "log: a grant's claims")

    # A short token lifetime (stub started from the service-account file)
    short = short_stub.port
    status, answer = grant(ctx, short, make_jwt(key, claims_for(short)))
    equal((status, (answer or {}).get("expires_in")), (200, 2), "short lifetime: granted for 2 s")
    auth = {"Authorization": f"Bearer {answer['access_token']}", "Content-Type": "application/json"}
    equal(https(ctx, short, "POST", vertex_path("claude-x"), json.dumps(vertex_body()).encode(), auth)[0], 200,
          "short lifetime: fresh token works")
    time.sleep(2.3)
    status, _, data = https(ctx, short, "POST", vertex_path("claude-x"), json.dumps(vertex_body()).encode(), auth)
    equal((status, json.loads(data)), (401, {"error": {"code": 401, "message": json.loads(data)["error"]["message"],
                                                       "status": "UNAUTHENTICATED"}}), "expired access token: 401")
    check(json.loads(data)["error"]["message"].startswith("Request had invalid authentication credentials."), "401 message")
    equal(grant(ctx, short, make_jwt(key, claims_for(port)))[0], 400, "another stub's audience refused")


# MARK: Strict Bedrock


def bedrock_strict_checks(ctx, fake, stub, lenient_stub):
    br = Bedrock(ctx, stub)
    model_raw = "anthropic.claude-x-v1%3A0"

    def refused(body, message, name, model=model_raw):
        status, headers, data = br.request(model, body)
        equal((status, headers.get("x-amzn-ErrorType"), json.loads(data).get("message")), (400, "ValidationException", message), name)
        check(len(headers.get("x-amzn-RequestId", "")) == 36, f"{name}: x-amzn-RequestId")

    n = fake.count()
    refused(bedrock_body(cache_control={"type": "ephemeral"}), "cache_control: Extra inputs are not permitted", "top-level cache_control: 400")
    refused(bedrock_body(service_tier="auto"), "service_tier: Extra inputs are not permitted", "unknown member: 400")
    refused(bedrock_body(metadata={"user_id": "u"}), "metadata: Extra inputs are not permitted", "metadata (not in AWS's list): 400")
    refused(bedrock_body(anthropic_beta=["context-1m-2025-08-07", "mcp-servers-2025-12-04"]), "invalid beta flag", "unknown beta: 400")
    refused(bedrock_body(anthropic_beta=["prompt-caching-scope-2026-01-05"]), "invalid beta flag", "prompt-caching-scope beta: 400")
    refused(bedrock_body(output_config={"effort": "low"}), "output_config: Extra inputs are not permitted", "output_config, other model: 400")
    refused(bedrock_body(output_config={"effort": "low"}), "output_config: Extra inputs are not permitted",
            "output_config, Haiku 4.5: 400", model="us.anthropic.claude-haiku-4-5-20251001-v1%3A0")
    refused(bedrock_body(output_config={"effort": "low"}), "output_config: Extra inputs are not permitted",
            "output_config, Opus 4.5 without its beta: 400", model="anthropic.claude-opus-4-5-20251101-v1%3A0")
    refused(bedrock_body(output_config={"effort": "max"}, anthropic_beta=["effort-2025-11-24"]),
            "output_config.effort: Input should be 'low', 'medium' or 'high'", "output_config, Opus 4.5 effort max: 400",
            model="anthropic.claude-opus-4-5-20251101-v1%3A0")
    equal(fake.count(), n, "strict refusals are not forwarded")
    log = [r for r in stub.log() if r.get("refused")]
    check({r["refused"] for r in log} >= {"cache_control", "member", "beta", "output_config"}, "log: each refusal names its rule",
          sorted({r["refused"] for r in log}))

    n = fake.count()
    for model in ("global.anthropic.claude-opus-4-6-v1", "anthropic.claude-sonnet-4-6", "us.anthropic.claude-opus-4-7"):
        body = bedrock_body(output_config={"effort": "high"}, thinking={"type": "adaptive"}, context_management={"edits": []},
                            anthropic_beta=["context-management-2025-06-27"])
        equal(br.request(model, body)[0], 200, f"output_config on {model}: 200")
    equal(br.request("anthropic.claude-opus-4-5-20251101-v1%3A0", bedrock_body(output_config={"effort": "medium"},
                                                                              anthropic_beta=["effort-2025-11-24"]))[0], 200,
          "output_config on Opus 4.5 with its beta: 200")
    seen = fake.since(n)
    equal([r["body"].get("output_config") for r in seen], [{"effort": "high"}] * 3 + [{"effort": "medium"}], "output_config forwarded")

    lenient = Bedrock(ctx, lenient_stub, token=None)
    n = fake.count()
    status = lenient.request(model_raw, bedrock_body(cache_control={"type": "ephemeral"}, output_config={"effort": "low"},
                                                     anthropic_beta=["beta-one"]))[0]
    equal(status, 200, "--lenient: cache_control, output_config and any beta: 200")
    status, _, data = lenient.request("stub-cache", bedrock_body(), stream=True)
    equal(json.loads(chunk_bytes(decode_frames(data)[-1])), {"type": "message_stop"}, "--lenient: message_stop as the model sent it")

    # Cache counts move onto message_stop beside the invocation metrics.
    status, _, data = br.request("anthropic.claude-cache-v1", bedrock_body(), stream=True)
    stop = json.loads(chunk_bytes(decode_frames(data)[-1]))
    equal((stop["usage"]["cache_creation_input_tokens"], stop["usage"]["cache_read_input_tokens"],
           stop["amazon-bedrock-invocationMetrics"]["cacheWriteInputTokenCount"],
           stop["amazon-bedrock-invocationMetrics"]["cacheReadInputTokenCount"],
           stop["amazon-bedrock-invocationMetrics"]["inputTokenCount"]), (5, 7, 5, 7, 12),
          "stream: cache counts on message_stop and in the invocation metrics, inputTokenCount without them")


def bedrock_messages_api_checks(ctx, fake, stub):
    br = Bedrock(ctx, stub)
    path = "/anthropic/v1/messages"
    version = {"anthropic-version": "2023-06-01"}
    body = {"model": "global.anthropic.claude-opus-4-7", "max_tokens": 64, "messages": [{"role": "user", "content": "Bonjour"}]}

    n = fake.count()
    status, headers, data = br.request("", body, path=path, signed_headers=dict(version, **{"anthropic-beta": "context-1m-2025-08-07"}))
    equal(status, 200, "Messages API: 200")
    seen = fake.since(n)
    if check(len(seen) == 1, "Messages API: forwarded once"):
        equal(data, seen[0]["sent"], "Messages API: the API's JSON bytes unchanged")
        equal(seen[0]["body"], body, "Messages API: the body as it came, model included")
        equal(seen[0]["headers"].get("anthropic-beta"), ["context-1m-2025-08-07"], "Messages API: betas from the header")
    check(len(headers.get("x-amzn-RequestId", "")) == 36, "Messages API: x-amzn-RequestId")

    n = fake.count()
    status, headers, data = br.request("", dict(body, stream=True), path=path, signed_headers=version)
    equal((status, headers.get("content-type")), (200, "text/event-stream; charset=utf-8"), "Messages API stream: SSE")
    equal(data, fake.since(n)[0]["sent"] if fake.since(n) else None, "Messages API stream: the API's SSE bytes unchanged")

    def refused(name, message, **changes):
        args = dict(path=path, signed_headers=version)
        args.update(changes)
        request_body = args.pop("request_body", body)
        status, headers, data = br.request("", request_body, **args)
        equal((status, headers.get("x-amzn-ErrorType"), json.loads(data).get("message")), (400, "ValidationException", message), name)

    n = fake.count()
    refused("Messages API without anthropic-version: 400", "anthropic-version: header is required and must be '2023-06-01'",
            signed_headers={})
    refused("Messages API without model: 400", "model: Field required", request_body={"max_tokens": 5, "messages": []})
    refused("Messages API: anthropic_version in the body: 400", "anthropic_version: Extra inputs are not permitted",
            request_body=dict(body, anthropic_version="bedrock-2023-05-31"))
    refused("Messages API: anthropic_beta in the body: 400", "anthropic_beta: Extra inputs are not permitted",
            request_body=dict(body, anthropic_beta=["context-1m-2025-08-07"]))
    refused("Messages API: top-level cache_control: 400", "cache_control: Extra inputs are not permitted",
            request_body=dict(body, cache_control={"type": "ephemeral"}))
    refused("Messages API: unknown beta: 400", "invalid beta flag", signed_headers=dict(version, **{"anthropic-beta": "files-api-2025-04-14"}))
    status, headers, _ = br.request("", body, path=path, signed_headers=version, service="bedrock-mantle")
    equal((status, headers.get("x-amzn-ErrorType")), (403, "InvalidSignatureException"), "Messages API signed for bedrock-mantle: 403")
    equal(fake.count(), n, "Messages API refusals are not forwarded")
    n = fake.count()
    status, headers, data = br.request("", dict(body, model="global.anthropic.claude-too-long"), path=path, signed_headers=version)
    equal((status, headers.get("x-amzn-ErrorType"), json.loads(data).get("error", {}).get("message")),
          (400, None, "prompt is too long: 208310 tokens > 200000 maximum"), "Messages API too-long: the API's own 400")
    equal(fake.count(), n, "Messages API too-long is not forwarded")
    status, headers, _ = br.request("", body, path=path + "/count_tokens", signed_headers=version)
    equal((status, headers.get("x-amzn-ErrorType")), (404, "UnknownOperationException"), "/anthropic/v1/messages/count_tokens: 404")


def bedrock_count_tokens_checks(ctx, fake, stub):
    br = Bedrock(ctx, stub)

    def wrapped(inner):
        return {"input": {"invokeModel": {"body": base64.b64encode(json.dumps(inner).encode()).decode()}}}

    n = fake.count()
    status, headers, data = br.request("", wrapped(bedrock_body(anthropic_beta=["context-1m-2025-08-07"])),
                                       path="/model/anthropic.claude-x-v1%3A0/count-tokens")
    equal((status, json.loads(data)), (200, {"inputTokens": 42}), "CountTokens: 200 {inputTokens}")
    seen = fake.since(n)
    if check(len(seen) == 1, "CountTokens: forwarded once"):
        equal(seen[0]["path"], "/v1/messages/count_tokens", "CountTokens: to count_tokens")
        equal(seen[0]["body"], {"model": "anthropic.claude-x-v1:0", "messages": [{"role": "user", "content": "Bonjour"}]},
              "CountTokens: the body without anthropic_version, betas and max_tokens")
        equal(seen[0]["headers"].get("anthropic-beta"), ["context-1m-2025-08-07"], "CountTokens: betas as the header")
    n = fake.count()
    for name, outer in [("converse input", {"input": {"converse": {"messages": []}}}),
                        ("body not base64", {"input": {"invokeModel": {"body": "%%%"}}}),
                        ("no max_tokens", wrapped({k: v for k, v in bedrock_body().items() if k != "max_tokens"})),
                        ("top-level cache_control", wrapped(bedrock_body(cache_control={"type": "ephemeral"})))]:
        status, headers, _ = br.request("", outer, path="/model/anthropic.claude-x-v1%3A0/count-tokens")
        equal((status, headers.get("x-amzn-ErrorType")), (400, "ValidationException"), f"CountTokens, {name}: 400")
    equal(fake.count(), n, "CountTokens refusals are not forwarded")


def bedrock_host_checks(ctx, fake, stub):
    br = Bedrock(ctx, stub, token=None)
    real = "bedrock-runtime.us-east-1.amazonaws.com"
    equal(br.request("anthropic.claude-x-v1%3A0", bedrock_body(), host=real)[0], 200, "--check-host: the real host: 200")
    n = fake.count()
    for host in (f"127.0.0.1:{stub.port}", "bedrock-runtime.us-west-2.amazonaws.com", "bedrock-mantle.us-east-1.api.aws"):
        status, headers, _ = br.request("anthropic.claude-x-v1%3A0", bedrock_body(), host=host)
        equal((status, headers.get("x-amzn-ErrorType")), (404, "UnknownOperationException"), f"--check-host: Host {host}: 404")
    equal(fake.count(), n, "--check-host: nothing forwarded for another host")


# MARK: Strict Vertex AI


def vertex_token(ctx, stub, key):
    status, answer = grant(ctx, stub.port, make_jwt(key, claims_for(stub.port)))
    return {"Authorization": f"Bearer {answer['access_token']}", "Content-Type": "application/json"}


def vertex_strict_checks(ctx, fake, stub, lenient_stub, key):
    auth = vertex_token(ctx, stub, key)

    def refused(body, message, name, model="claude-sonnet-4-5@20250929", headers=None):
        status, response_headers, data = https(ctx, stub.port, "POST", vertex_path(model), json.dumps(body).encode(), dict(auth, **(headers or {})))
        answer = json.loads(data)
        equal((status, answer.get("type"), answer.get("error", {}).get("type"), answer.get("error", {}).get("message")),
              (400, "error", "invalid_request_error", message), name)
        check(answer.get("request_id", "").startswith("req_vrtx_") and response_headers.get("request-id") == answer.get("request_id"),
              f"{name}: a req_vrtx_ request id", answer.get("request_id"))

    n = fake.count()
    refused(vertex_body(cache_control={"type": "ephemeral"}), "cache_control: Extra inputs are not permitted", "vertex top-level cache_control: 400")
    refused(vertex_body(instructions="x"), "instructions: Extra inputs are not permitted", "vertex unknown member: 400")
    refused(vertex_body(anthropic_beta=["context-1m-2025-08-07"]), "anthropic_beta: Extra inputs are not permitted", "vertex betas in the body: 400")
    refused(vertex_body(output_config={"format": {"type": "json_schema", "schema": {}}}), "output_config: Extra inputs are not permitted",
            "vertex output_config on Sonnet 4.5: 400")
    refused(vertex_body(output_config={"effort": "low"}), "output_config: Extra inputs are not permitted",
            "vertex output_config on Haiku 4.5: 400", model="claude-haiku-4-5@20251001")
    refused(vertex_body(), "Unexpected value(s) `effort-2025-11-24`, `prompt-caching-scope-2026-01-05` for the `anthropic-beta` header. "
            "Please consult our documentation at docs.anthropic.com or try again without the header.", "vertex unknown betas: 400",
            headers={"anthropic-beta": "context-1m-2025-08-07,effort-2025-11-24", "Anthropic-Beta": "prompt-caching-scope-2026-01-05"})
    equal(fake.count(), n, "vertex strict refusals are not forwarded")

    n = fake.count()
    for model in ("claude-opus-4-6@default", "claude-sonnet-4-6@default", "claude-opus-4-7@default"):
        status = https(ctx, stub.port, "POST", vertex_path(model), json.dumps(vertex_body(output_config={"effort": "high"},
                                                                                           metadata={"user_id": "u"})).encode(), auth)[0]
        equal(status, 200, f"vertex output_config on {model}: 200")
    equal([r["body"].get("output_config") for r in fake.since(n)], [{"effort": "high"}] * 3, "vertex output_config forwarded")

    lenient_auth = vertex_token(ctx, lenient_stub, key)
    status = https(ctx, lenient_stub.port, "POST", vertex_path("claude-x"),
                   json.dumps(vertex_body(cache_control={"type": "ephemeral"}, output_config={"effort": "low"})).encode(),
                   dict(lenient_auth, **{"anthropic-beta": "beta-one"}))[0]
    equal(status, 200, "vertex --lenient: cache_control, output_config and any beta: 200")

    # count-tokens:rawPredict keeps the model in the body.
    n = fake.count()
    count_path = vertex_path("count-tokens")
    body = {"anthropic_version": "vertex-2023-10-16", "model": "claude-sonnet-4-5@20250929", "messages": [{"role": "user", "content": "Hi"}]}
    status, headers, data = https(ctx, stub.port, "POST", count_path, json.dumps(body).encode(), dict(auth, **{"anthropic-beta": "context-1m-2025-08-07"}))
    equal((status, json.loads(data)), (200, {"input_tokens": 42}), "vertex count-tokens: 200 {input_tokens}")
    seen = fake.since(n)
    if check(len(seen) == 1, "vertex count-tokens: forwarded once"):
        equal((seen[0]["path"], seen[0]["body"]), ("/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "anthropic_version"}),
              "vertex count-tokens: to count_tokens, model kept")
    n = fake.count()
    status, _, data = https(ctx, stub.port, "POST", count_path, json.dumps({k: v for k, v in body.items() if k != "model"}).encode(), auth)
    equal((status, json.loads(data)["error"]["message"]), (400, "model: Field required"), "vertex count-tokens without model: 400")
    status, _, _ = https(ctx, stub.port, "POST", count_path, json.dumps(dict(body, max_tokens=5)).encode(), auth)
    equal(status, 400, "vertex count-tokens with max_tokens: 400")
    status, _, _ = https(ctx, stub.port, "POST", count_path, json.dumps(body).encode(), dict(auth, **{"anthropic-beta": "effort-2025-11-24"}))
    equal(status, 400, "vertex count-tokens with an unknown beta: 400")
    status, _, _ = https(ctx, stub.port, "POST", vertex_path("count-tokens", "streamRawPredict"), json.dumps(body).encode(), auth)
    equal(status, 404, "vertex count-tokens:streamRawPredict: 404")
    equal(fake.count(), n, "vertex count-tokens refusals are not forwarded")


def vertex_host_checks(ctx, fake, stubs, key):
    """`stubs`: region -> a stub started with that --region and --check-host."""
    for region, host in [("global", "aiplatform.googleapis.com"), ("us", "aiplatform.us.rep.googleapis.com"),
                         ("eu", "aiplatform.eu.rep.googleapis.com"), ("us-east5", "us-east5-aiplatform.googleapis.com")]:
        stub = stubs[region]
        form = urlencode({"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                          "assertion": make_jwt(key, claims_for(stub.port, aud="https://oauth2.googleapis.com/token"))}).encode()
        status, _, data = https(ctx, stub.port, "POST", "/token", form, {"Content-Type": "application/x-www-form-urlencoded",
                                                                           "Host": "oauth2.googleapis.com"})
        equal(status, 200, f"{region}: a grant on oauth2.googleapis.com for its token URL: 200")
        auth = {"Authorization": f"Bearer {json.loads(data).get('access_token', '')}", "Content-Type": "application/json"}
        path = vertex_path("claude-x", region=region)
        status = https(ctx, stub.port, "POST", path, json.dumps(vertex_body()).encode(), dict(auth, Host=host))[0]
        equal(status, 200, f"{region}: rawPredict on {host}: 200")
        wrong = ["global-aiplatform.googleapis.com" if region == "global" else f"{region}-aiplatform.googleapis.com",
                 "oauth2.googleapis.com", f"127.0.0.1:{stub.port}"]
        if region in ("us", "eu"):
            wrong[0] = f"{region}-aiplatform.googleapis.com"
        n = fake.count()
        for other in wrong if region != "us-east5" else ["aiplatform.googleapis.com", "oauth2.googleapis.com"]:
            status, headers, data = https(ctx, stub.port, "POST", path, json.dumps(vertex_body()).encode(), dict(auth, Host=other))
            equal((status, headers.get("content-type")), (404, "text/html; charset=UTF-8"), f"{region}: rawPredict on {other}: Google's HTML 404")
            check(b"<title>Error 404 (Not Found)!!1</title>" in data and path.encode() in data, f"{region}: the 404 page names the path")
        equal(fake.count(), n, f"{region}: nothing forwarded for another host")
        status, _, _ = https(ctx, stub.port, "POST", "/token", form, {"Content-Type": "application/x-www-form-urlencoded", "Host": host})
        equal(status, 404, f"{region}: /token on the API host: 404")


# MARK: Main


def main():
    directory = tempfile.mkdtemp(prefix="cloud-stubs-selfcheck-")
    stubs = []
    fake = None
    try:
        make_pki(directory)
        key = make_service_account(directory)
        for name, value in [("secret", SECRET), ("session", SESSION)]:
            with open(os.path.join(directory, name), "w") as f:
                f.write(value + "\n")
        ctx = client_context(directory)
        fake = Fake()
        tls = ["--cert", os.path.join(directory, "server.pem"), "--key", os.path.join(directory, "server.key"),
               "--anthropic-url", f"http://127.0.0.1:{fake.port}", "--anthropic-key", FAKE_KEY]
        aws = ["--region", REGION, "--access-key-id", AKID, "--secret-key-file", os.path.join(directory, "secret")]
        gcp = ["--project", PROJECT, "--region", VREGION]
        bedrock = Stub("bedrock", "bedrock_stub.py", tls + aws + ["--session-token-file", os.path.join(directory, "session")],
                       directory)
        stubs.append(bedrock)
        bedrock_plain = Stub("bedrock-plain", "bedrock_stub.py", tls + aws, directory)
        stubs.append(bedrock_plain)
        vertex = Stub("vertex", "vertex_stub.py", tls + gcp + ["--public-key-file", os.path.join(directory, "sa-public.pem"),
                                                                "--client-email", CLIENT_EMAIL], directory)
        stubs.append(vertex)
        vertex_short = Stub("vertex-short", "vertex_stub.py",
                            tls + gcp + ["--service-account-file", os.path.join(directory, "sa.json"), "--token-lifetime", "2"],
                            directory)
        stubs.append(vertex_short)

        bedrock_lenient = Stub("bedrock-lenient", "bedrock_stub.py", tls + aws + ["--lenient"], directory)
        stubs.append(bedrock_lenient)
        bedrock_host = Stub("bedrock-host", "bedrock_stub.py", tls + aws + ["--check-host"], directory)
        stubs.append(bedrock_host)
        vertex_lenient = Stub("vertex-lenient", "vertex_stub.py", tls + gcp + ["--public-key-file", os.path.join(directory, "sa-public.pem"),
                                                                                "--client-email", CLIENT_EMAIL, "--lenient"], directory)
        stubs.append(vertex_lenient)
        vertex_hosts = {}
        for region in ("global", "us", "eu", "us-east5"):
            vertex_hosts[region] = Stub(f"vertex-{region}", "vertex_stub.py",
                                        tls + ["--project", PROJECT, "--region", region, "--public-key-file",
                                               os.path.join(directory, "sa-public.pem"), "--client-email", CLIENT_EMAIL, "--check-host"],
                                        directory)
            stubs.append(vertex_hosts[region])

        section("Bedrock", bedrock_checks, ctx, fake, bedrock, bedrock_plain)
        section("Bedrock, strict", bedrock_strict_checks, ctx, fake, bedrock, bedrock_lenient)
        section("Bedrock, Messages API", bedrock_messages_api_checks, ctx, fake, bedrock)
        section("Bedrock, CountTokens", bedrock_count_tokens_checks, ctx, fake, bedrock)
        section("Bedrock, --check-host", bedrock_host_checks, ctx, fake, bedrock_host)
        section("Vertex AI", vertex_checks, ctx, fake, vertex, vertex_short, key)
        section("Vertex AI, strict and count-tokens", vertex_strict_checks, ctx, fake, vertex, vertex_lenient, key)
        section("Vertex AI, --check-host", vertex_host_checks, ctx, fake, vertex_hosts, key)

        print("- SIGTERM")
        for stub in stubs:
            started = time.monotonic()
            code = stub.stop()
            check(code == 0 and time.monotonic() - started < 3, f"{stub.name}: exits 0 on SIGTERM", code)
    except Exception:
        traceback.print_exc()
        CHECKS.failed.append("setup")
    finally:
        for stub in stubs:
            stub.stop()
        if fake:
            fake.stop()
        if CHECKS.failed or KEEP:
            for stub in stubs if CHECKS.failed else ():
                sys.stdout.write(f"--- {stub.name} stderr:\n{open(stub.stderr_path).read()}")
            print(f"files kept in {directory}")
        else:
            subprocess.run(["rm", "-rf", directory])
    print(f"{CHECKS.passed} checks passed, {len(CHECKS.failed)} failed")
    if CHECKS.failed:
        for name in CHECKS.failed:
            print(f"  failed: {name}")
        sys.exit(1)


if __name__ == "__main__":
    main()
