#!/usr/bin/env python3
"""Amazon Bedrock Runtime's Claude routes, over TLS, for tests.

InvokeModel and InvokeModelWithResponseStream (`POST /model/{id}/invoke` and
`/invoke-with-response-stream`), CountTokens (`POST /model/{id}/count-tokens`) and the Messages
API (`POST /anthropic/v1/messages`). The stub checks each request's SigV4 signature itself (the
signature is recomputed with botocore, not with the code under test), refuses what Bedrock is
documented and reported to refuse (the tables below; `--lenient` turns that off), turns the
request into a Messages API request for the Anthropic stub, and turns the answer back into what
Bedrock sends: the JSON unchanged, or each SSE event's data in an AWS event-stream `chunk` frame,
`message_stop` carrying the usage and `amazon-bedrock-invocationMetrics`.

    bedrock_stub.py --cert server.pem --key server.key \\
        --anthropic-url http://127.0.0.1:PORT --anthropic-key KEY \\
        --region us-east-1 --access-key-id AKID --secret-key-file secret.txt \\
        [--session-token-file token.txt] [--log requests.jsonl] [--port N] [--lenient] [--check-host]

It prints `PORT <n>` once listening. `--check-host` refuses a request whose Host is not
`bedrock-runtime.{region}.amazonaws.com` (for clients that reach the stub by that name). Model
ids containing these words script the answer: `throttle`, `unavailable`, `not-ready`, `denied`
(refused without forwarding; `denied` names the IAM principal and account, as AWS does),
`too-long` (a context overflow: InvokeModel and CountTokens answer 400 ValidationException
"Input is too long for requested model.", the Messages API route the API's own 400 "prompt is
too long: 208310 tokens > 200000 maximum"), and on
the streaming route `midstream-exception`, `bad-prelude-crc`, `bad-message-crc`,
`truncated-frame`, `oversized-frame`, `headers-past-frame`.
"""

import argparse
import base64
import calendar
import hashlib
import hmac
import json
import os
import re
import struct
import sys
import time
import zlib
from urllib.parse import unquote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

try:
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
except ImportError:
    raise SystemExit("bedrock_stub: botocore is missing; run `make venv` and start the stub with .venv/bin/python")

SERVICE = "bedrock"
BEDROCK_VERSION = "bedrock-2023-05-31"
MESSAGES_VERSION = "2023-06-01"
ERROR_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
ROUTE = re.compile(r"^/model/([^/?]+)/(invoke|invoke-with-response-stream|count-tokens)$")
MESSAGES_ROUTE = "/anthropic/v1/messages"


# MARK: What Bedrock refuses (docs/relay.md has this table with the same sources)

# The betas Bedrock's Claude models take, in an InvokeModel body's `anthropic_beta` or the
# Messages API's `anthropic-beta` header; any other is 400 ValidationException "invalid beta
# flag" (claude-code#49648, #56595; TOKENICODE#59). The union of two public lists: litellm#19877
# ("per AWS docs") and litellm's anthropic_beta_headers_config.json, block "bedrock" (non-null
# values). Bedrock varies by model (claude-code#49370: Opus 4.7 took only interleaved thinking);
# the stub keeps one list.
ACCEPTED_BETAS = {
    "computer-use-2024-10-22",            # litellm#19877; AWS request and response page's example
    "computer-use-2025-01-24",            # litellm#19877, litellm config
    "computer-use-2025-11-24",            # litellm config
    "token-efficient-tools-2025-02-19",   # litellm#19877
    "interleaved-thinking-2025-05-14",    # litellm#19877; claude-code#49370
    "output-128k-2025-02-19",             # litellm#19877
    "dev-full-thinking-2025-05-14",       # litellm#19877
    "context-1m-2025-08-07",              # litellm#19877, litellm config
    "context-management-2025-06-27",      # litellm#19877, litellm config
    "effort-2025-11-24",                  # litellm#19877, litellm config; coder/coder#25356
    "tool-search-tool-2025-10-19",        # litellm#19877, litellm config; vercel/ai#13900
    "tool-examples-2025-10-29",           # litellm#19877
    "fine-grained-tool-streaming-2025-05-14",  # litellm config
    "compact-2026-01-12",                 # litellm config
    "dangerous-tool-use-2026-09-03",      # litellm config
    "thinking-binding-controls-2026-08-01",    # litellm config
    "thinking-display-updates-2026-08-18",     # litellm config
    "mid-conversation-output-config-2026-07-01",   # litellm config
    "mid-conversation-tool-changes-2026-07-01",    # litellm config
}

# Top-level members an InvokeModel body may hold: AWS's "Anthropic Claude Messages API: request
# and response" page (anthropic_version, anthropic_beta, max_tokens, system, messages,
# temperature, top_p, top_k, tools, tool_choice, stop_sequences), extended thinking (`thinking`)
# and context editing (`context_management`, with its beta). Any other is 400 "NAME: Extra inputs
# are not permitted": `cache_control` (inspect_ai#3851), `guardrails`, `reasoning`, `extra_body`
# (litellm#13825, #13609, #15637). `model` and `stream` get Bedrock's older "extraneous key" text.
INVOKE_MEMBERS = {"anthropic_version", "anthropic_beta", "max_tokens", "system", "messages", "temperature", "top_p", "top_k",
                  "tools", "tool_choice", "stop_sequences", "thinking", "context_management"}
# The Messages API takes the model and `stream` in the body and betas in the header.
MESSAGES_MEMBERS = {"model", "stream", "max_tokens", "system", "messages", "temperature", "top_p", "top_k",
                    "tools", "tool_choice", "stop_sequences", "thinking", "context_management"}


def _opus_4_5_output_config(body, betas):
    """Opus 4.5 takes output_config.effort only with its beta, and only low, medium or high (coder/coder#25356)."""
    if "effort-2025-11-24" not in betas:
        return "output_config: Extra inputs are not permitted"
    effort = (body.get("output_config") or {}).get("effort") if isinstance(body.get("output_config"), dict) else None
    if effort is not None and effort not in ("low", "medium", "high"):
        return "output_config.effort: Input should be 'low', 'medium' or 'high'"
    return None


# The models that take `output_config` (effort, structured output format); for any other model
# it is 400 "output_config: Extra inputs are not permitted" (claude-code-action#1005 and
# claude-code#51377: output_config.effort; hindsight#3300: output_config.format on Haiku 4.5).
OUTPUT_CONFIG_MODELS = [
    (re.compile(r"claude-opus-4-5"), _opus_4_5_output_config),   # coder/coder#25356
    (re.compile(r"claude-(opus|sonnet)-4-6"), None),              # claude-code-action#1005 (switching to 4.6 works)
    (re.compile(r"claude-opus-4-[7-9]|claude-(opus|sonnet|haiku)-5"), None),  # coder/coder#25356 (adaptive-only Opus 4.7+)
]
AMZ_DATE = re.compile(r"^\d{8}T\d{6}Z$")
HOST = re.compile(r"^[A-Za-z0-9.\-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")
MAX_SKEW_SECONDS = 15 * 60
SIGNATURE_MISMATCH = ("The request signature we calculated does not match the signature you provided. "
                      "Check your AWS Secret Access Key and signing method. Consult the service documentation for details.")
BAD_TOKEN = "The security token included in the request is invalid."
PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

MALFORMED = ("bad-prelude-crc", "bad-message-crc", "truncated-frame", "oversized-frame", "headers-past-frame")


# MARK: Event-stream frames


def encode_headers(headers):
    out = bytearray()
    for name, value in headers:
        name_bytes, value_bytes = name.encode("utf-8"), value.encode("utf-8")
        out += struct.pack(">B", len(name_bytes)) + name_bytes
        out += struct.pack(">BH", 7, len(value_bytes)) + value_bytes
    return bytes(out)


def frame(headers, payload, headers_length=None, total_length=None):
    """One event-stream message; the two lengths can be overridden (CRCs stay right)."""
    header_bytes = encode_headers(headers)
    total = total_length if total_length is not None else 12 + len(header_bytes) + len(payload) + 4
    hlen = headers_length if headers_length is not None else len(header_bytes)
    prelude = struct.pack(">II", total, hlen)
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + header_bytes + payload
    return message + struct.pack(">I", zlib.crc32(message))


def chunk_frame(data, index):
    payload = json.dumps({"bytes": base64.b64encode(data).decode("ascii"),
                          "p": PADDING[:1 + (index * 11) % len(PADDING)]}, separators=(",", ":")).encode("utf-8")
    return frame([(":event-type", "chunk"), (":content-type", "application/json"), (":message-type", "event")], payload)


def exception_frame(exception_type, message):
    payload = json.dumps({"message": message}, separators=(",", ":")).encode("utf-8")
    return frame([(":exception-type", exception_type), (":content-type", "application/json"),
                  (":message-type", "exception")], payload)


def flip_u32(data, at):
    return data[:at] + struct.pack(">I", struct.unpack(">I", data[at:at + 4])[0] ^ 0xDEADBEEF) + data[at + 4:]


def malformed_frame(kind, data, index):
    good = chunk_frame(data, index)
    if kind == "bad-prelude-crc":
        return flip_u32(good, 8)
    if kind == "bad-message-crc":
        return flip_u32(good, len(good) - 4)
    if kind == "truncated-frame":
        return good[:len(good) // 2]
    if kind == "oversized-frame":
        prelude = struct.pack(">II", 0x7FFFFFF0, 0)
        return prelude + struct.pack(">I", zlib.crc32(prelude)) + b"\x00" * 16
    if kind == "headers-past-frame":
        headers = [(":event-type", "chunk"), (":content-type", "application/json"), (":message-type", "event")]
        payload = good[12 + len(encode_headers(headers)):-4]
        total = 12 + len(encode_headers(headers)) + len(payload) + 4
        return frame(headers, payload, headers_length=total - 16 + 9, total_length=total)
    raise ValueError(kind)


# MARK: SigV4


def canonical_uri_self_test():
    """Bedrock is not S3: botocore encodes the (already encoded) path once more. Refuse to start
    on a botocore that does otherwise, since every verification would then be wrong."""
    signer = SigV4Auth(Credentials("AKID", "secret"), SERVICE, "us-east-1")
    request = AWSRequest(method="POST", url="https://bedrock.invalid/model/a.b-v1%3A0/invoke", data=b"{}")
    request.headers["host"] = "bedrock.invalid"
    request.context["timestamp"] = "20240101T000000Z"
    line = signer.canonical_request(request).split("\n")[1]
    if line != "/model/a.b-v1%253A0/invoke":
        raise SystemExit(f"bedrock_stub: this botocore's canonical URI is {line!r}, not the double-encoded one")


class SignatureFailure(common.HTTPFailure):
    def __init__(self, reason, error_type="InvalidSignatureException", message=SIGNATURE_MISMATCH):
        super().__init__(403, message, kind=error_type, reason=reason)


def parse_authorization(value):
    scheme, _, rest = value.partition(" ")
    if scheme != "AWS4-HMAC-SHA256":
        raise SignatureFailure(f"Authorization scheme {scheme!r} is not AWS4-HMAC-SHA256",
                               message=f"Authorization header is not AWS4-HMAC-SHA256: {value}")
    fields = {}
    for part in rest.split(","):
        key, eq, val = part.strip().partition("=")
        if not eq or key in fields:
            raise SignatureFailure(f"malformed Authorization component {part.strip()!r}",
                                   message=f"Authorization header is malformed: {value}")
        fields[key] = val
    missing = [k for k in ("Credential", "SignedHeaders", "Signature") if k not in fields]
    if missing or len(fields) != 3:
        raise SignatureFailure(f"Authorization lacks {missing} or has extra fields {sorted(fields)}",
                               message=f"Authorization header is malformed: {value}")
    return fields


def verify_sigv4(handler, app, body, record):
    """Raises SignatureFailure unless the request is signed for this stub's key, region and service
    (or, with --api-key-file, carries that Bedrock API key as a bearer token)."""
    headers = handler.headers
    values = headers.get_all("Authorization") or []
    if len(values) != 1:
        raise SignatureFailure(f"{len(values)} Authorization headers", message="Missing Authentication Token")
    if values[0].startswith("Bearer ") and app.api_key is not None:
        record["auth"] = "bedrock-api-key"
        if not hmac.compare_digest(values[0][len("Bearer "):].encode(), app.api_key.encode()):
            raise SignatureFailure("the Bedrock API key is not the configured one", error_type="UnrecognizedClientException", message=BAD_TOKEN)
        return
    fields = parse_authorization(values[0])

    scope = fields["Credential"].split("/")
    if len(scope) != 5:
        raise SignatureFailure(f"Credential {fields['Credential']!r} is not AKID/date/region/service/aws4_request",
                               message="Credential should be scoped to a valid region.")
    akid, scope_date, region, service, terminator = scope
    record["access_key_id"] = akid
    secret, session_token = app.credentials_for(akid)

    dates = headers.get_all("X-Amz-Date") or []
    if len(dates) != 1 or not AMZ_DATE.match(dates[0]):
        raise SignatureFailure(f"X-Amz-Date {dates} is missing or not YYYYMMDDTHHMMSSZ",
                               message="Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.")
    amz_date = dates[0]
    if scope_date != amz_date[:8]:
        raise SignatureFailure(f"credential scope date {scope_date} is not X-Amz-Date's {amz_date[:8]}")
    if region != app.region:
        raise SignatureFailure(f"credential scope region {region!r} is not {app.region!r}",
                               message="Credential should be scoped to a valid region.")
    if service != SERVICE:
        raise SignatureFailure(f"credential scope service {service!r} is not {SERVICE!r}",
                               message=f"Credential should be scoped to correct service: '{SERVICE}'.")
    if terminator != "aws4_request":
        raise SignatureFailure(f"credential scope terminator {terminator!r} is not aws4_request",
                               message="Credential should be scoped with a valid terminator: 'aws4_request'")
    try:
        signed_at = calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise SignatureFailure(f"X-Amz-Date {amz_date!r} is not a date",
                               message="Date must be in ISO-8601 'basic format'.")
    skew = time.time() - signed_at
    record["clock_skew_seconds"] = round(skew)
    if abs(skew) > MAX_SKEW_SECONDS:
        raise SignatureFailure(f"X-Amz-Date {amz_date} is {round(skew)} s from now (15 min allowed)",
                               message=f"Signature expired: {amz_date} is now earlier or later than the allowed 15 minutes.")

    signed_text = fields["SignedHeaders"]
    signed = signed_text.split(";")
    if not signed_text or any(not name or name != name.lower() or name != name.strip() for name in signed):
        raise SignatureFailure(f"SignedHeaders {signed_text!r} is malformed (lower case names, ';' between)")
    for required in ("host", "x-amz-date"):
        if required not in signed:
            raise SignatureFailure(f"{required} is not among the signed headers {signed_text!r}")
    absent = [name for name in signed if headers.get(name) is None]
    if absent:
        raise SignatureFailure(f"signed headers {absent} are not in the request")

    tokens = headers.get_all("X-Amz-Security-Token") or []
    if session_token is not None:
        if len(tokens) != 1 or not hmac.compare_digest(tokens[0].encode(), session_token.encode()):
            raise SignatureFailure(f"X-Amz-Security-Token is {'missing' if not tokens else 'not the configured session token'}",
                                   error_type="UnrecognizedClientException", message=BAD_TOKEN)
        if "x-amz-security-token" not in signed:
            raise SignatureFailure("x-amz-security-token is not among the signed headers")
    elif tokens:
        raise SignatureFailure("X-Amz-Security-Token sent, but this stub has no session token",
                               error_type="UnrecognizedClientException", message=BAD_TOKEN)

    content_hashes = headers.get_all("X-Amz-Content-SHA256") or []
    if content_hashes:
        actual = hashlib.sha256(body).hexdigest()
        if len(content_hashes) != 1 or content_hashes[0] != actual:
            raise SignatureFailure(f"X-Amz-Content-SHA256 {content_hashes} is not sha256(body) {actual}",
                                   message="The provided 'x-amz-content-sha256' header does not match what was computed.")

    # The path exactly as it came, with the host the client signed.
    target = handler.path
    if not target.startswith("/") or any(ord(c) > 126 or ord(c) < 33 for c in target):
        raise SignatureFailure(f"request target {target!r} is not an origin-form ASCII path")
    host = headers.get_all("Host") or []
    if len(host) != 1 or not HOST.match(host[0]):
        raise SignatureFailure(f"Host header {host} is missing, repeated or not a host[:port]")
    request = AWSRequest(method=handler.command, url=f"https://{host[0]}{target}", data=body)
    for name in signed:
        for value in headers.get_all(name):
            request.headers[name] = value  # HTTPMessage: a repeated name keeps every value
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(akid, secret, session_token), SERVICE, region)
    botocore_signed = signer.signed_headers(signer.headers_to_sign(request))
    if botocore_signed != signed_text:
        refused = sorted(set(signed) - set(botocore_signed.split(";")))
        raise SignatureFailure(f"botocore signs {botocore_signed!r}, the client signed {signed_text!r}"
                               + (f" (botocore never signs {refused})" if refused else " (names must be sorted and unique)"))
    canonical = signer.canonical_request(request)
    string_to_sign = signer.string_to_sign(request, canonical)
    expected = signer.signature(string_to_sign, request)
    if not hmac.compare_digest(expected.encode(), fields["Signature"].encode()):
        record["canonical_request"] = canonical
        record["string_to_sign"] = string_to_sign
        raise SignatureFailure(f"signature mismatch: expected {expected}, got {fields['Signature']}")


# MARK: The app


def read_secret(path):
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


class BedrockApp(common.App):
    def __init__(self, args):
        super().__init__(args)
        self.region = args.region
        self.access_key_id = args.access_key_id
        self.secret = read_secret(args.secret_key_file)
        self.session_token = read_secret(args.session_token_file) if args.session_token_file else None
        self.issued_file = args.issued_credentials
        self.api_key = read_secret(args.api_key_file) if args.api_key_file else None
        self.host = f"bedrock-runtime.{self.region}.amazonaws.com"

    def credentials_for(self, akid):
        """(secret, session token) of the configured key, or of one credentials_stub.py issued
        (refused once it has expired, as AWS refuses an expired session token)."""
        if hmac.compare_digest(akid.encode(), self.access_key_id.encode()):
            return self.secret, self.session_token
        if self.issued_file:
            try:
                with open(self.issued_file, encoding="utf-8") as f:
                    entry = json.load(f).get("aws", {}).get(akid)
            except (OSError, ValueError):
                entry = None
            if entry is not None:
                if entry["expires"] <= time.time():
                    raise SignatureFailure(f"issued credentials {akid} expired {round(time.time() - entry['expires'], 1)} s ago",
                                           error_type="ExpiredTokenException", message="The security token included in the request is expired")
                return entry["secret"], entry["token"]
        raise SignatureFailure(f"unknown access key id {akid!r}", error_type="UnrecognizedClientException", message=BAD_TOKEN)


def error_type_for(status):
    """The Bedrock status and exception for an Anthropic stub's status."""
    if status == 400 or status == 413:
        return 400, "ValidationException"
    if status in (401, 403):
        return 403, "AccessDeniedException"
    if status == 404:
        return 404, "ResourceNotFoundException"
    if status == 408:
        return 408, "ModelTimeoutException"
    if status == 429:
        return 429, "ThrottlingException"
    if status in (503, 529):
        return 503, "ServiceUnavailableException"
    if 400 <= status < 500:
        return 400, "ValidationException"
    return 500, "InternalServerException"


def upstream_message(data):
    try:
        message = json.loads(data)["error"]["message"]
        if isinstance(message, str):
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return data[:500].decode("utf-8", "replace")


class BedrockHandler(common.StubHandler):
    server_version = "bedrock-stub"

    def send_failure(self, failure):
        kind = failure.kind or "ValidationException"
        status = failure.status
        if kind == "upstream":  # the Anthropic stub unreachable or failing: Bedrock's own 500
            kind, status = "InternalServerException" + ERROR_SUFFIX, 500
        elif "Exception" not in kind:
            kind = "ValidationException"
        headers = [("x-amzn-RequestId", common.request_id()), ("x-amzn-ErrorType", kind)] + failure.headers
        self.send_whole(status, {"message": failure.message}, headers)

    def model_failure(self, status, error_type, message, headers=()):
        """A refusal in the model's name: the ErrorType carries the coral suffix, as Bedrock's do."""
        return common.HTTPFailure(status, message, kind=error_type + ERROR_SUFFIX, headers=headers)

    def validation(self, message, reason=None):
        return common.HTTPFailure(400, message, kind="ValidationException", reason=reason)

    def route(self, record):
        raw_path = self.path.split("?", 1)[0]
        if self.app.check_host:
            host = common.host_of(self)
            record["host"] = host
            if host != self.app.host:
                # Only a client that resolved another name could get here: AWS has no such operation on it.
                raise common.HTTPFailure(404, None, kind="UnknownOperationException", close=True,
                                         reason=f"Host {host!r} is not {self.app.host!r}, the host this stub stands in for")
        if self.command == "POST" and raw_path == MESSAGES_ROUTE:
            return self.messages_api(record)
        match = ROUTE.match(raw_path)
        if self.command != "POST" or not match:
            raise common.HTTPFailure(404, None, kind="UnknownOperationException", close=True,
                                     reason=f"no route for {self.command} {raw_path}")
        raw_model, operation = match.groups()
        model_id = unquote(raw_model)
        record.update(model=model_id, model_id_raw=raw_model, operation=operation)
        body = self.read_body(self.app.max_body)
        verify_sigv4(self, self.app, body, record)
        record["verified"] = True
        if operation == "count-tokens":
            return self.count_tokens(record, model_id, body)
        streaming = operation == "invoke-with-response-stream"
        record["stream"] = streaming
        parsed, betas = self.invoke_body(body, model_id, record)
        self.scripted_refusal(model_id, record)

        forward = {"model": model_id}
        forward.update((k, v) for k, v in parsed.items() if k not in ("anthropic_version", "anthropic_beta"))
        if streaming:
            forward["stream"] = True
        self.forward(record, model_id, forward, betas, streaming)

    # MARK: The request

    def invoke_body(self, body, model_id, record):
        """An InvokeModel body checked as Bedrock checks it: (the object, its betas)."""
        try:
            parsed = json.loads(body)
        except ValueError as error:
            raise self.validation(f"Malformed input request: {error}, please reformat your input and try again.")
        record["body"] = parsed
        if not isinstance(parsed, dict):
            raise self.validation("Malformed input request: expected type: JSONObject, please reformat your input and try again.")
        if parsed.get("anthropic_version") != BEDROCK_VERSION:
            raise self.validation(f"Malformed input request: #/anthropic_version: must be {BEDROCK_VERSION!r}, "
                                  "please reformat your input and try again.")
        extraneous = [key for key in ("model", "stream") if key in parsed]
        if extraneous:
            raise self.validation(f"Malformed input request: #: extraneous key [{extraneous[0]}] is not permitted, "
                                  "please reformat your input and try again.")
        betas = parsed.get("anthropic_beta")
        if betas is not None and not (isinstance(betas, list) and all(isinstance(b, str) for b in betas)):
            raise self.validation("Malformed input request: #/anthropic_beta: expected type: JSONArray of strings, "
                                  "please reformat your input and try again.")
        self.strict_checks(parsed, INVOKE_MEMBERS, model_id, betas or [], record)
        return parsed, betas or []

    def strict_checks(self, parsed, members, model_id, betas, record):
        """Betas outside the accepted list, then top-level members Bedrock does not take."""
        if not self.app.strict:
            return
        bad = common.refused_betas(betas, ACCEPTED_BETAS)
        if bad:
            record["refused"] = "beta"
            raise self.validation("invalid beta flag", reason=f"betas not accepted by Bedrock: {bad}")
        try:
            common.check_members(parsed, members, model_id, OUTPUT_CONFIG_MODELS, betas)
        except common.Refusal as refusal:
            record["refused"] = refusal.kind
            raise self.validation(refusal.message)

    def scripted_refusal(self, model_id, record):
        if "too-long" in model_id:
            record["behaviour"] = "too-long"
            raise self.validation("Input is too long for requested model.")
        if "throttle" in model_id:
            record["behaviour"] = "throttle"
            raise self.model_failure(429, "ThrottlingException", "Too many requests, please wait before trying again.",
                                     headers=[("retry-after", "7")])
        if "unavailable" in model_id:
            record["behaviour"] = "unavailable"
            raise self.model_failure(503, "ServiceUnavailableException", "Bedrock is unable to process your request.")
        if "denied" in model_id:
            record["behaviour"] = "denied"
            raise self.model_failure(403, "AccessDeniedException",
                                     "User: arn:aws:sts::123456789012:assumed-role/attestd-relay/i-0abc is not authorized to perform: "
                                     f"bedrock:InvokeModel on resource: arn:aws:bedrock:{self.app.region}::foundation-model/{model_id}")
        if "not-ready" in model_id:
            record["behaviour"] = "not-ready"
            raise self.model_failure(429, "ModelNotReadyException",
                                     "Model is not ready to serve inference requests. The SDK will automatically retry the operation.")

    def forward(self, record, model_id, forward, betas, streaming):
        upstream_body = json.dumps(forward, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        upstream_headers = self.app.upstream.headers(",".join(betas) if betas else None)
        with common.Exchange(self, self.app.upstream, upstream_body, upstream_headers) as exchange:
            status = exchange.response.status
            record["upstream_status"] = status
            if status != 200:
                raise self.mapped_failure(exchange, status)
            if streaming:
                self.relay_stream(exchange, model_id, record)
            else:
                self.relay_whole(exchange, record)

    def mapped_failure(self, exchange, status):
        """The Anthropic stub's error as Bedrock's exception."""
        data = self.read_upstream_error(exchange)
        mapped, error_type = error_type_for(status)
        headers = []
        if status == 429 and exchange.response.getheader("retry-after"):
            headers.append(("retry-after", exchange.response.getheader("retry-after")))
        return self.model_failure(mapped, error_type, upstream_message(data), headers=headers)

    # MARK: CountTokens

    def count_tokens(self, record, model_id, body):
        """`POST /model/{id}/count-tokens` with `{"input": {"invokeModel": {"body": BASE64}}}`, the
        body an InvokeModel body (botocore's bedrock-runtime model; anthropic-sdk-python#1650):
        answers `{"inputTokens": N}`."""
        record["operation"] = "count-tokens"
        try:
            outer = json.loads(body)
        except ValueError as error:
            raise self.validation(f"Malformed input request: {error}")
        record["body"] = outer
        shape = outer.get("input") if isinstance(outer, dict) else None
        if not isinstance(shape, dict) or set(shape) != {"invokeModel"} or not isinstance(shape["invokeModel"], dict) \
                or set(shape["invokeModel"]) != {"body"} or not isinstance(shape["invokeModel"]["body"], str):
            raise self.validation("1 validation error detected: Value at 'input' failed to satisfy constraint: "
                                  "this stub takes {\"input\": {\"invokeModel\": {\"body\": BASE64}}} only")
        try:
            inner = base64.b64decode(shape["invokeModel"]["body"], validate=True)
        except (ValueError, TypeError):
            raise self.validation("Value at 'input.invokeModel.body' is not base64")
        parsed, betas = self.invoke_body(inner, model_id, record)
        record["body"] = parsed
        if "max_tokens" not in parsed:  # the body must be one InvokeModel would take (anthropic-sdk-python#1043)
            raise self.validation("Malformed input request: #: required key [max_tokens] not found, please reformat your input and try again.")
        self.scripted_refusal(model_id, record)
        forward = {"model": model_id}
        forward.update((k, v) for k, v in parsed.items() if k not in ("anthropic_version", "anthropic_beta", "max_tokens"))
        upstream_body = json.dumps(forward, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        headers = self.app.upstream.headers(",".join(betas) if betas else None)
        with common.Exchange(self, self.app.upstream, upstream_body, headers, path=self.app.upstream.count_path) as exchange:
            status = exchange.response.status
            record["upstream_status"] = status
            if status != 200:
                raise self.mapped_failure(exchange, status)
            try:
                tokens = int(json.loads(exchange.read_all())["input_tokens"])
            except (ValueError, KeyError, TypeError, common.UpstreamBroken) as error:
                raise self.model_failure(500, "InternalServerException", f"The model's count was unreadable: {error}")
        self.send_whole(200, {"inputTokens": tokens}, [("x-amzn-RequestId", common.request_id())])

    # MARK: The Messages API

    def messages_api(self, record):
        """`POST /anthropic/v1/messages`: the Messages API body with Bedrock's model ID in `model`,
        betas in `anthropic-beta`, signed with SigV4 for `bedrock` (AWS's "Inference using Anthropic
        Messages API" page); the answer is the API's own, JSON or SSE."""
        record["operation"] = "messages"
        body = self.read_body(self.app.max_body)
        verify_sigv4(self, self.app, body, record)
        record["verified"] = True
        versions = self.headers.get_all("anthropic-version") or []
        if versions != [MESSAGES_VERSION]:
            raise self.validation(f"anthropic-version: header is required and must be {MESSAGES_VERSION!r}",
                                  reason=f"anthropic-version headers {versions}")
        try:
            parsed = json.loads(body)
        except ValueError as error:
            raise self.validation(f"There was an error parsing the body of your request: {error}")
        record["body"] = parsed
        if not isinstance(parsed, dict):
            raise self.validation("The request body must be a JSON object")
        model_id = parsed.get("model")
        if not isinstance(model_id, str) or not model_id:
            raise self.validation("model: Field required")
        stream = parsed.get("stream", False)
        if not isinstance(stream, bool):
            raise self.validation("stream: Input should be a valid boolean")
        record.update(model=model_id, stream=stream)
        betas = common.split_betas(self.headers.get_all("anthropic-beta") or [])
        self.strict_checks(parsed, MESSAGES_MEMBERS, model_id, betas, record)
        if "too-long" in model_id:
            # The model's own refusal, as the API words it (the route answers the API's errors as they are).
            record["behaviour"] = "too-long"
            return self.send_whole(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                    "message": "prompt is too long: 208310 tokens > 200000 maximum"}},
                                   [("x-amzn-RequestId", common.request_id())])
        self.scripted_refusal(model_id, record)
        upstream_body = json.dumps(parsed, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        headers = self.app.upstream.headers(",".join(betas) if betas else None)
        with common.Exchange(self, self.app.upstream, upstream_body, headers) as exchange:
            response = exchange.response
            record["upstream_status"] = response.status
            content_type = response.getheader("content-type") or "application/json"
            answer_headers = [("x-amzn-RequestId", common.request_id())]
            if response.getheader("retry-after"):
                answer_headers.append(("retry-after", response.getheader("retry-after")))
            if not content_type.startswith("text/event-stream"):
                try:
                    data = exchange.read_all()
                except common.UpstreamBroken as error:
                    raise self.model_failure(500, "InternalServerException", "The model's answer ended early.") from error
                return self.send_whole(response.status, data, answer_headers, content_type=content_type)
            self.start_chunked(response.status, answer_headers, content_type=content_type)
            try:
                for piece in exchange.chunks():
                    self.send_chunk(piece)
            except common.UpstreamBroken as error:
                record["reason"] = f"the Anthropic stub's stream broke: {error}"
                record["upstream_broken"] = True
                self.abort()
                return
            self.end_chunked()

    # MARK: Answers

    def read_upstream_error(self, exchange):
        try:
            return exchange.read_all()
        except common.UpstreamBroken as error:
            return f"the model's error answer was cut short: {error}".encode()

    def relay_whole(self, exchange, record):
        try:
            data = exchange.read_all()
        except common.UpstreamBroken as error:
            raise self.model_failure(500, "InternalServerException", "The model's answer ended early.") from error
        headers = [("x-amzn-RequestId", common.request_id())]
        try:
            usage = json.loads(data).get("usage") or {}
            headers += [("X-Amzn-Bedrock-Input-Token-Count", str(int(usage["input_tokens"]))),
                        ("X-Amzn-Bedrock-Output-Token-Count", str(int(usage["output_tokens"])))]
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        self.send_whole(200, data, headers)

    def relay_stream(self, exchange, model_id, record):
        content_type = exchange.response.getheader("content-type", "")
        if not content_type.startswith("text/event-stream"):
            raise self.model_failure(500, "InternalServerException", f"The model streamed {content_type!r}, not events.")
        behaviour = next((b for b in ("midstream-exception",) + MALFORMED if b in model_id), None)
        record["behaviour"] = behaviour
        self.start_chunked(200, [("x-amzn-RequestId", common.request_id()),
                                 ("X-Amzn-Bedrock-Content-Type", "application/json")],
                           content_type="application/vnd.amazon.eventstream")
        reader = common.SSEReader()
        metrics = StreamMetrics() if self.app.strict else None
        sent = 0
        record["frames"] = 0
        # `first-…`: the malformed frame is the stream's very first; otherwise two good ones go first.
        good_before = 0 if "first-" in model_id else 2

        def finish_early(last):
            self.send_chunk(last)
            record["frames"] = sent + 1
            exchange.abandon()
            record["abandoned"] = True
            self.end_chunked()

        try:
            for piece in exchange.chunks():
                for _name, data in reader.feed(piece):
                    if behaviour in MALFORMED and sent == good_before:
                        return finish_early(malformed_frame(behaviour, data, sent))
                    if metrics is not None:
                        data = metrics.see(data)
                        if metrics.stopped:
                            record["invocation_metrics"] = metrics.invocation
                    self.send_chunk(chunk_frame(data, sent))
                    sent += 1
                    record["frames"] = sent
                    if behaviour == "midstream-exception" and sent == 3:
                        return finish_early(exception_frame("throttlingException",
                                                            "Too many tokens, please wait before trying again."))
        except common.UpstreamBroken as error:
            record["reason"] = f"the Anthropic stub's stream broke: {error}"
            record["upstream_broken"] = True
            self.abort()
            return
        if behaviour in MALFORMED:
            return finish_early(malformed_frame(behaviour, b'{"type":"ping"}', sent))
        if behaviour == "midstream-exception":
            return finish_early(exception_frame("throttlingException", "Too many tokens, please wait before trying again."))
        self.end_chunked()


class StreamMetrics:
    """Bedrock's last chunk: `message_stop` carries the stream's usage, cache counts included, and
    `amazon-bedrock-invocationMetrics` (litellm#34373, #24845, #36878). The counts come from the
    events before it (`message_start`'s usage, `message_delta`'s output tokens); `inputTokenCount`
    leaves cache reads and writes out, as the usage's `input_tokens` does (litellm#36878)."""

    def __init__(self):
        self.started = time.monotonic()
        self.first_byte = None
        self.usage = {}
        self.stopped = False
        self.invocation = None

    def see(self, data):
        """The event's data as Bedrock sends it."""
        if self.first_byte is None:
            self.first_byte = time.monotonic()
        try:
            event = json.loads(data)
        except ValueError:
            return data
        if not isinstance(event, dict):
            return data
        kind = event.get("type")
        if kind == "message_start":
            usage = (event.get("message") or {}).get("usage") or {}
            self.usage.update((k, v) for k, v in usage.items() if isinstance(v, int))
        elif kind == "message_delta":
            usage = event.get("usage") or {}
            self.usage.update((k, v) for k, v in usage.items() if isinstance(v, int))
        elif kind == "message_stop":
            self.stopped = True
            now = time.monotonic()
            usage = {"input_tokens": self.usage.get("input_tokens", 0),
                     "cache_creation_input_tokens": self.usage.get("cache_creation_input_tokens", 0),
                     "cache_read_input_tokens": self.usage.get("cache_read_input_tokens", 0),
                     "output_tokens": self.usage.get("output_tokens", 0)}
            self.invocation = {"inputTokenCount": usage["input_tokens"], "outputTokenCount": usage["output_tokens"],
                               "invocationLatency": int((now - self.started) * 1000),
                               "firstByteLatency": int(((self.first_byte or now) - self.started) * 1000),
                               "cacheReadInputTokenCount": usage["cache_read_input_tokens"],
                               "cacheWriteInputTokenCount": usage["cache_creation_input_tokens"]}
            event["usage"] = usage
            event["amazon-bedrock-invocationMetrics"] = self.invocation
            return json.dumps(event, separators=(",", ":")).encode("utf-8")
        return data


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_arguments(parser)
    parser.add_argument("--region", required=True)
    parser.add_argument("--access-key-id", required=True)
    parser.add_argument("--secret-key-file", required=True, help="file holding the secret access key")
    parser.add_argument("--session-token-file", help="file holding the session token; requests must then carry and sign it")
    parser.add_argument("--issued-credentials", help="credentials_stub.py's --issued file: the temporary keys it issued are accepted too, "
                                                     "until they expire")
    parser.add_argument("--api-key-file", help="file holding a Bedrock API key, accepted as Authorization: Bearer")
    canonical_uri_self_test()
    common.run("bedrock_stub", parser, BedrockApp, BedrockHandler)


if __name__ == "__main__":
    main()
