"""What the Bedrock and Vertex AI test stubs share.

A threaded HTTPS server on 127.0.0.1 (HTTP/1.1, keep-alive), request bodies read with a size
limit, answers with Content-Length or chunked, the forward to the Anthropic Messages API stub
(plain HTTP) that is cut the moment the client leaves, an SSE reader, the JSON-lines request log,
the `PORT <n>` announcement on stdout, and the strict checks both clouds make of a Messages body
(top-level members, `cache_control`, betas, `output_config`), each stub with its own tables.
"""

import http.client
import http.server
import json
import os
import select
import signal
import socket
import ssl
import sys
import threading
import time
import uuid
from urllib.parse import urlsplit

DEFAULT_MAX_BODY = 8 * 1024 * 1024
UPSTREAM_TIMEOUT = 300


class HTTPFailure(Exception):
    """An answer decided before the exchange could go on; `kind` lets each stub shape its body."""

    def __init__(self, status, message, kind=None, close=False, headers=(), reason=None):
        super().__init__(message)
        self.status = status
        self.message = message  # what the client is told
        self.kind = kind
        self.close = close
        self.headers = list(headers)
        self.reason = reason or message  # what the log says


class ClientGone(Exception):
    """The client closed its connection (or a write to it failed)."""


class UpstreamBroken(Exception):
    """The Anthropic stub's answer ended before it was complete."""


# MARK: Arguments, log, server


def add_common_arguments(parser):
    parser.add_argument("--cert", required=True, help="PEM certificate chain the TLS server presents")
    parser.add_argument("--key", required=True, help="PEM private key of --cert")
    parser.add_argument("--anthropic-url", required=True, help="the Anthropic Messages API stub, http://127.0.0.1:PORT")
    parser.add_argument("--anthropic-key", required=True, help="the x-api-key sent to the Anthropic stub")
    parser.add_argument("--log", help="append one JSON object per handled request to this file")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, help="largest request body accepted (413 above)")
    parser.add_argument("--lenient", action="store_true",
                        help="accept any top-level member, beta and output_config, and leave Bedrock's message_stop as the "
                             "Anthropic stub sent it (by default the stub refuses and answers as its cloud is documented and "
                             "reported to; see docs/relay.md)")
    parser.add_argument("--check-host", action="store_true",
                        help="refuse a request whose Host is not the cloud's real host for --region, as its front end would "
                             "(for clients that reach the stub by the real name, e.g. attestd --upstream-connect-to)")


class RequestLog:
    """JSON lines, one per request, appended and flushed at once; also counts what tests ask for."""

    def __init__(self, path):
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8") if path else None
        self.counters = {}

    def count(self, name, by=1):
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + by

    def get(self, name):
        with self._lock:
            return self.counters.get(name, 0)

    def write(self, record):
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str)
        with self._lock:
            if record.get("cancelled"):
                self.counters["cancelled"] = self.counters.get("cancelled", 0) + 1
            if self._file:
                self._file.write(line + "\n")
                self._file.flush()


class TLSServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, port, handler_class, context, app):
        self.ssl_context = context
        self.app = app
        super().__init__(("127.0.0.1", port), handler_class)

    def get_request(self):
        sock, address = self.socket.accept()
        # The handshake runs on the connection's own thread (on its first read), so a client that
        # stalls in it holds only that thread.
        tls = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return tls, address

    def handle_error(self, request, client_address):
        kind, value, _ = sys.exc_info()
        if isinstance(value, (ssl.SSLError, ConnectionError, socket.timeout, TimeoutError)):
            return  # a client that left or failed its handshake: nothing to report
        sys.stderr.write(f"cloud-stub: error on a connection from {client_address}: {kind.__name__}: {value}\n")


def tls_context(cert, key):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    return context


def serve(server, name):
    """Announce the port, serve until SIGTERM or SIGINT, then close the listening socket."""

    def stop(signum, _frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # A parent's blocked signals are inherited (a test runner's threads block SIGTERM): unblock.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except SystemExit:
        pass
    finally:
        server.server_close()
        sys.stderr.write(f"{name}: stopped\n")
        sys.stderr.flush()
    # Handler threads are daemons: streams still open end with the process.
    os._exit(0)


# MARK: Watching the client while the upstream works


class ClientWatch:
    """Polls the client's socket (never reads it) and calls `on_gone` once when the peer hangs up.

    A client that cancels a stream closes its connection; its FIN shows as POLLRDHUP at once,
    long before a write to it would fail, so the upstream connection is cut as soon as possible.
    """

    def __init__(self, sock, on_gone):
        self._fd = sock.fileno()
        self._on_gone = on_gone
        self._wake_r, self._wake_w = os.pipe()
        self.gone = False
        self._thread = threading.Thread(target=self._run, name="client-watch", daemon=True)
        self._thread.start()

    def _run(self):
        poller = select.poll()
        poller.register(self._fd, select.POLLRDHUP)  # POLLHUP and POLLERR come without asking
        poller.register(self._wake_r, select.POLLIN)
        while True:
            try:
                events = poller.poll()
            except InterruptedError:
                continue
            for fd, mask in events:
                if fd == self._wake_r:
                    return
                if mask & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    self.gone = True
                    try:
                        self._on_gone()
                    finally:
                        return

    def stop(self):
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)


# MARK: The Anthropic stub


class Upstream:
    def __init__(self, url, api_key):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise SystemExit(f"--anthropic-url must be http://HOST:PORT, not {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.path = parts.path.rstrip("/") + "/v1/messages"
        self.count_path = self.path + "/count_tokens"
        self.api_key = api_key

    def headers(self, beta=None):
        headers = {
            "x-api-key": self.api_key,
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }
        if beta:
            headers["anthropic-beta"] = beta
        return headers


class Exchange:
    """One POST to the Anthropic stub on a connection of its own, cut when the client leaves.

    Use as a context manager; `response` is the http.client response once entered. Reading it
    raises ClientGone when the client left meanwhile, UpstreamBroken when the upstream's answer
    was cut short.
    """

    def __init__(self, handler, upstream, body, headers, path=None):
        self.handler = handler
        self.upstream = upstream
        self.body = body
        self.headers = headers
        self.path = path or upstream.path
        self.conn = None
        self.response = None
        self.watch = None
        self.abandoned = False  # we ended the upstream exchange on purpose (scripted behaviours)

    def _cut(self):
        sock = self.conn.sock if self.conn else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self):
        self.conn = http.client.HTTPConnection(self.upstream.host, self.upstream.port, timeout=UPSTREAM_TIMEOUT)
        try:
            self.conn.connect()
        except OSError as error:
            self.conn.close()
            raise HTTPFailure(502, f"the Anthropic stub at {self.upstream.host}:{self.upstream.port} is unreachable: {error}",
                              kind="upstream") from error
        self.watch = ClientWatch(self.handler.connection, self._cut)
        try:
            self.conn.request("POST", self.path, body=self.body, headers=self.headers)
            self.response = self.conn.getresponse()
        except (OSError, http.client.HTTPException) as error:
            self.__exit__(None, None, None)
            if self.watch.gone:
                raise ClientGone() from error
            raise HTTPFailure(502, f"the Anthropic stub failed: {error!r}", kind="upstream") from error
        return self

    @property
    def client_gone(self):
        return self.watch is not None and self.watch.gone

    def read_all(self):
        try:
            data = self.response.read()
        except (OSError, http.client.HTTPException) as error:
            if self.client_gone:
                raise ClientGone() from error
            raise UpstreamBroken(repr(error)) from error
        if self.client_gone:
            raise ClientGone()
        return data

    def chunks(self):
        """The body as it arrives, each piece as soon as the upstream sent it."""
        while True:
            try:
                piece = self.response.read1(65536)
            except (OSError, http.client.HTTPException) as error:
                if self.client_gone:
                    raise ClientGone() from error
                raise UpstreamBroken(repr(error)) from error
            if self.client_gone:
                raise ClientGone()
            if not piece:
                return
            yield piece

    def abandon(self):
        self.abandoned = True
        self._cut()

    def __exit__(self, *exc):
        if self.watch is not None:
            self.watch.stop()
        if self.conn is not None:
            self.conn.close()
        return False


class SSEReader:
    """Splits an event stream into events: (event name, data bytes) for each with data lines."""

    def __init__(self):
        self._buffer = b""
        self._name = None
        self._data = []

    def feed(self, piece):
        self._buffer += piece
        events = []
        while True:
            at = self._buffer.find(b"\n")
            if at < 0:
                break
            line = self._buffer[:at]
            self._buffer = self._buffer[at + 1:]
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append((self._name or "message", b"\n".join(self._data)))
                self._name, self._data = None, []
                continue
            if line.startswith(b":"):
                continue
            field, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if field == b"data":
                self._data.append(value)
            elif field == b"event":
                self._name = value.decode("utf-8", "replace")
        return events

    @property
    def pending(self):
        """Bytes or fields of an event not yet closed by its blank line."""
        return bool(self._buffer or self._data or self._name)


# MARK: Strict checks of a Messages body (each stub has its own tables)


class Refusal(Exception):
    """A body or header the cloud refuses: `message` in the cloud's words, `kind` the rule (for the log)."""

    def __init__(self, message, kind):
        super().__init__(message)
        self.message = message
        self.kind = kind


def split_betas(values):
    """Betas from `anthropic-beta` header values (comma-separated, the header possibly repeated)."""
    return [b.strip() for value in values for b in value.split(",") if b.strip()]


def check_members(body, known, model, output_config_models, betas):
    """Refuses a top-level member the cloud does not take: `cache_control` (automatic caching),
    any name not in `known`, and `output_config` unless `output_config_models` allows it for
    `model` (a list of (regex, condition, source); a condition is a function of (body, betas)
    returning None or why it is refused)."""
    for name in body:
        if name == "output_config":
            rule = next((r for r in output_config_models if r[0].search(model or "")), None)
            if rule is None:
                raise Refusal("output_config: Extra inputs are not permitted", "output_config")
            why = rule[1](body, betas) if rule[1] else None
            if why:
                raise Refusal(why, "output_config")
        elif name not in known:
            raise Refusal(f"{name}: Extra inputs are not permitted", "cache_control" if name == "cache_control" else "member")


def refused_betas(betas, accepted):
    """The betas not in `accepted`, each once, in order."""
    out = []
    for beta in betas:
        if beta not in accepted and beta not in out:
            out.append(beta)
    return out


def host_of(handler):
    """The request's single Host, lower case, without a default `:443`; None when absent or repeated."""
    values = handler.headers.get_all("Host") or []
    if len(values) != 1:
        return None
    host = values[0].strip().lower()
    return host[:-4] if host.endswith(":443") else host


def google_html_404(path):
    """What Google's front end answers for a host or path it does not serve: an HTML page, not JSON
    (reported for `global-aiplatform.googleapis.com` in tensorzero#4306 and promptfoo#6569)."""
    code = path.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return ("<!DOCTYPE html>\n<html lang=en>\n  <meta charset=utf-8>\n"
            "  <title>Error 404 (Not Found)!!1</title>\n"
            "  <p><b>404.</b> <ins>That\u2019s an error.</ins>\n"
            f"  <p>The requested URL <code>{code}</code> was not found on this server.  <ins>That\u2019s all we know.</ins>\n")


# MARK: The request handler


class StubHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "cloud-stub"
    sys_version = ""
    timeout = 120  # an idle keep-alive connection is closed after this long
    # The head and the body are separate writes: with Nagle's algorithm the body waits for the
    # client's delayed ACK of the head (40 ms a request).
    disable_nagle_algorithm = True

    # Subclasses implement `route(record)`, which answers or raises HTTPFailure, and
    # `send_failure(failure)`, which shapes a refusal the way their cloud does.

    def log_message(self, format, *args):  # the JSON-lines log is the record
        pass

    @property
    def app(self):
        return self.server.app

    def handle_one_request(self):
        try:
            super().handle_one_request()
        except (ConnectionError, ssl.SSLError, socket.timeout, TimeoutError):
            self.close_connection = True

    def _dispatch(self):
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "method": self.command,
            "path": self.path,
            "status": None,
            "verified": False,
            "reason": None,
            "model": None,
            "stream": False,
            "cancelled": False,
            "body": None,
            # Which headers came (names only: no credential reaches the log) and the betas named
            # in `anthropic-beta`, so that a test sees what a client sent beyond the body.
            "header_names": sorted({name.lower() for name in self.headers.keys()}),
            "beta_header": self.headers.get_all("anthropic-beta") or [],
        }
        self._status = None
        try:
            try:
                self.route(record)
            except HTTPFailure as failure:
                record["reason"] = record["reason"] or failure.reason
                if failure.close:
                    self.close_connection = True
                self.send_failure(failure)
        except ClientGone:
            record["cancelled"] = True
            record["reason"] = record["reason"] or "the client hung up before the answer was complete"
            self.close_connection = True
        except (ConnectionError, ssl.SSLError, BrokenPipeError, socket.timeout, TimeoutError) as error:
            # A write to the client failed.
            record["cancelled"] = True
            record["reason"] = record["reason"] or f"client write failed: {error!r}"
            self.close_connection = True
        finally:
            record["status"] = record["status"] or self._status
            self.app.log.write(record)

    do_GET = _dispatch
    do_POST = _dispatch
    do_PUT = _dispatch
    do_DELETE = _dispatch
    do_PATCH = _dispatch

    # Reading

    def read_body(self, limit):
        transfer = self.headers.get_all("Transfer-Encoding") or []
        lengths = self.headers.get_all("Content-Length") or []
        if transfer and lengths:
            raise HTTPFailure(400, "both Transfer-Encoding and Content-Length", kind="request", close=True)
        if transfer:
            if [t.strip().lower() for t in transfer] != ["chunked"]:
                raise HTTPFailure(501, f"unsupported Transfer-Encoding {transfer}", kind="request", close=True)
            return self._read_chunked(limit)
        if not lengths:
            return b""
        values = {v.strip() for v in lengths}
        if len(values) != 1 or not next(iter(values)).isdigit():
            raise HTTPFailure(400, f"bad Content-Length {lengths}", kind="request", close=True)
        length = int(next(iter(values)))
        if length > limit:
            raise HTTPFailure(413, f"request body of {length} bytes is over the limit of {limit}", kind="too_large", close=True)
        data = self.rfile.read(length)
        if len(data) != length:
            raise ClientGone()
        return data

    def _read_chunked(self, limit):
        body = bytearray()
        while True:
            line = self.rfile.readline(1024)
            if not line.endswith(b"\n"):
                raise ClientGone()
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HTTPFailure(400, "bad chunk size", kind="request", close=True)
            if size == 0:
                while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return bytes(body)
            if len(body) + size > limit:
                raise HTTPFailure(413, f"request body is over the limit of {limit}", kind="too_large", close=True)
            piece = self.rfile.read(size)
            if len(piece) != size:
                raise ClientGone()
            body += piece
            self.rfile.readline(8)

    # Writing

    def send_whole(self, status, body, headers=(), content_type="application/json"):
        """An answer with Content-Length."""
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body, separators=(",", ":")).encode("utf-8")
        self._status = status
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def start_chunked(self, status, headers=(), content_type=None):
        self._status = status
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send_chunk(self, data):
        if data:
            self.wfile.write(b"%X\r\n" % len(data) + bytes(data) + b"\r\n")
            self.wfile.flush()

    def end_chunked(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def abort(self):
        """End the connection without finishing the answer: the client sees a truncated body."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class App:
    """What a stub's handlers share: configuration, log, upstream."""

    def __init__(self, args):
        self.args = args
        self.log = RequestLog(args.log)
        self.upstream = Upstream(args.anthropic_url, args.anthropic_key)
        self.max_body = args.max_body
        self.strict = not args.lenient
        self.check_host = args.check_host


def request_id():
    return str(uuid.uuid4())


def run(name, parser, app_factory, handler_class):
    args = parser.parse_args()
    app = app_factory(args)
    server = TLSServer(args.port, handler_class, tls_context(args.cert, args.key), app)
    app.port = server.server_address[1]
    serve(server, name)
