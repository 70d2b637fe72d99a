#!/usr/bin/env python3
"""Google Vertex AI's Claude endpoints and Google's OAuth token endpoint, over TLS, for tests.

`POST /token` takes a service account's signed JWT (the jwt-bearer grant) and checks it itself
(RS256 with the account's public key, its issuer, scope, audience and times); the access tokens
it grants are the only ones `rawPredict`, `streamRawPredict` and `count-tokens:rawPredict`
accept. Those refuse what Vertex AI is documented and reported to refuse (the tables below;
`--lenient` turns that off), turn the Vertex body into a Messages API request for the Anthropic
stub and relay its answer unchanged, with a `request-id` of Vertex's `req_vrtx_` kind.

    vertex_stub.py --cert server.pem --key server.key \\
        --anthropic-url http://127.0.0.1:PORT --anthropic-key KEY \\
        --project P --region R --client-email SA@P.iam.gserviceaccount.com \\
        (--public-key-file sa-public.pem | --service-account-file sa.json) \\
        [--token-lifetime SECONDS] [--log requests.jsonl] [--port N] [--lenient] [--check-host]

It prints `PORT <n>` once listening. `--check-host` answers Google's HTML 404 to a request whose
Host is neither the region's API host (`global`: aiplatform.googleapis.com; `us`, `eu`:
aiplatform.{us,eu}.rep.googleapis.com; any other R: R-aiplatform.googleapis.com) nor, for
`/token`, oauth2.googleapis.com (whose token URL it then also takes as the JWT's audience). For
tests: `POST /_stub/token-endpoint?fail=1` makes `/token` answer 500 until `?fail=0`;
`GET /_stub/stats` counts grants, requests and cancellations. A model whose name contains
`throttle` is refused with 429, one containing `denied` with 403, and one containing `too-long`
with the API's context overflow (400 `invalid_request_error` "prompt is too long: 208310 tokens
> 200000 maximum", as Claude on Vertex words it), without forwarding.
"""

import argparse
import base64
import binascii
import json
import os
import re
import secrets
import sys
import threading
import time
from urllib.parse import parse_qs, unquote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa
except ImportError:
    raise SystemExit("vertex_stub: cryptography is missing; run `make venv` and start the stub with .venv/bin/python")

VERTEX_VERSION = "vertex-2023-10-16"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
MAX_TOKEN_LIFETIME = 3600
CLOCK_LEEWAY = 60
PREDICT = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/publishers/anthropic/models/([^/:]+?)"
                     r"(?::|%3[Aa])(rawPredict|streamRawPredict)$")
TOKEN_HOST = "oauth2.googleapis.com"
TOKEN_URL = f"https://{TOKEN_HOST}/token"


def api_host(region):
    """The API's host for a location, as the SDK builds it (anthropic-sdk-python lib/vertex/_client.py)."""
    return {"global": "aiplatform.googleapis.com", "us": "aiplatform.us.rep.googleapis.com",
            "eu": "aiplatform.eu.rep.googleapis.com"}.get(region, f"{region}-aiplatform.googleapis.com")


# MARK: What Vertex AI refuses (docs/relay.md has this table with the same sources)

# The betas Claude on Vertex takes in `anthropic-beta`; any other is 400 invalid_request_error
# "Unexpected value(s) `…` for the `anthropic-beta` header" (claude-agent-sdk-typescript#307,
# sub2api#3358, new-api#2975: effort-2025-11-24, prompt-caching-scope-2026-01-05,
# structured-outputs-2025-12-15, advisor-tool-2026-03-01, redact-thinking-2026-02-12, …). The
# list is litellm's anthropic_beta_headers_config.json, block "vertex_ai" (non-null values).
# Vertex rolls betas out per model (anthropic-sdk-typescript#1089: Haiku lags); the stub keeps
# one list, and takes web-search and tool-search, which #307 saw refused on one model.
ACCEPTED_BETAS = {
    "computer-use-2025-01-24", "computer-use-2025-11-24", "context-1m-2025-08-07", "context-management-2025-06-27",
    "interleaved-thinking-2025-05-14", "tool-search-tool-2025-10-19", "web-search-2025-03-05",
    "compact-2026-01-12", "compact-2026-09-04", "dangerous-tool-use-2026-09-03", "per-turn-control-2026-07-01",
    "thinking-binding-controls-2026-08-01", "thinking-display-updates-2026-08-18",
}

# Top-level members a rawPredict body may hold: the Messages API's (without `model`, which is in
# the URL) and `anthropic_version`. Any other is 400 "NAME: Extra inputs are not permitted":
# `cache_control` (inspect_ai#3851), `instructions` (opencode#4282); betas go in the header only.
PREDICT_MEMBERS = {"anthropic_version", "max_tokens", "messages", "stream", "system", "temperature", "top_p", "top_k",
                   "stop_sequences", "tools", "tool_choice", "thinking", "context_management", "metadata"}
# count-tokens:rawPredict keeps `model` in the body (anthropic-sdk-python lib/vertex/_client.py).
COUNT_MEMBERS = {"anthropic_version", "model", "messages", "system", "tools", "tool_choice", "thinking", "context_management"}

# The models that take `output_config`; for any other it is 400 "output_config: Extra inputs are
# not permitted" (Sonnet 4.5: OpenHands/software-agent-sdk#1630, litellm#21407; Haiku 4.5:
# anthropic-sdk-csharp#132; claude-code#37746).
OUTPUT_CONFIG_MODELS = [
    (re.compile(r"claude-(opus|sonnet)-4-6"), None),   # langfuse#17390 (effort on Vertex)
    (re.compile(r"claude-opus-4-[7-9]|claude-(opus|sonnet|haiku)-5"), None),  # claude-code#52811 (Opus 4.7 asks for output_config.effort)
]
BASE64URL = re.compile(r"^[A-Za-z0-9_-]*$")
GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 501: "UNIMPLEMENTED",
                 502: "INTERNAL", 503: "UNAVAILABLE"}


def google_error(code, message, status=None):
    return {"error": {"code": code, "message": message, "status": status or GOOGLE_STATUS.get(code, "UNKNOWN")}}


class GrantRefused(Exception):
    pass


def b64url(part, what):
    if not BASE64URL.match(part) or len(part) % 4 == 1:
        raise GrantRefused(f"Invalid JWT: the {what} is not base64url")
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise GrantRefused(f"Invalid JWT: the {what} is not base64url")


def verify_assertion(assertion, public_key, client_email, audiences, now):
    """The claims of a valid service-account assertion, else GrantRefused saying why."""
    parts = assertion.split(".")
    if len(parts) != 3:
        raise GrantRefused(f"Invalid JWT: {len(parts)} parts, not 3")
    try:
        header = json.loads(b64url(parts[0], "header"))
        claims = json.loads(b64url(parts[1], "claim set"))
    except ValueError:
        raise GrantRefused("Invalid JWT: header or claim set is not JSON")
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise GrantRefused("Invalid JWT: header and claim set must be JSON objects")
    if header.get("alg") != "RS256":
        raise GrantRefused(f"Invalid JWT: alg {header.get('alg')!r} is not RS256")
    if "typ" in header and header["typ"] != "JWT":
        raise GrantRefused(f"Invalid JWT: typ {header['typ']!r} is not JWT")
    signature = b64url(parts[2], "signature")
    try:
        public_key.verify(signature, f"{parts[0]}.{parts[1]}".encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise GrantRefused("Invalid JWT Signature.")
    if claims.get("iss") != client_email:
        raise GrantRefused(f"Invalid JWT: iss {claims.get('iss')!r} is not {client_email!r}")
    scope = claims.get("scope")
    if not isinstance(scope, str) or CLOUD_PLATFORM not in scope.split(" "):
        raise GrantRefused(f"Invalid OAuth scope: {scope!r} lacks {CLOUD_PLATFORM}")
    if claims.get("aud") not in audiences:
        raise GrantRefused(f"Invalid JWT: aud {claims.get('aud')!r} is not {audiences[0]!r}")
    iat, exp = claims.get("iat"), claims.get("exp")
    if type(iat) is not int or type(exp) is not int:
        raise GrantRefused("Invalid JWT: iat and exp must be integers")
    if not 0 < exp - iat <= MAX_TOKEN_LIFETIME:
        raise GrantRefused(f"Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
                           f"exp - iat is {exp - iat} s")
    if iat > now + CLOCK_LEEWAY:
        raise GrantRefused(f"Invalid JWT: iat {iat} is {iat - now} s in the future")
    if exp <= now:
        raise GrantRefused(f"Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
                           f"It expired {now - exp} s ago")
    return header, claims


class VertexApp(common.App):
    def __init__(self, args):
        super().__init__(args)
        self.project = args.project
        self.region = args.region
        self.api_host = api_host(args.region)
        self.lifetime = args.token_lifetime
        client_email = args.client_email
        if args.service_account_file:
            with open(args.service_account_file, encoding="utf-8") as f:
                account = json.load(f)
            key = serialization.load_pem_private_key(account["private_key"].encode(), password=None)
            self.public_key = key.public_key()
            client_email = client_email or account.get("client_email")
        elif args.public_key_file:
            with open(args.public_key_file, "rb") as f:
                self.public_key = serialization.load_pem_public_key(f.read())
        else:
            raise SystemExit("vertex_stub: --public-key-file or --service-account-file is required")
        if not isinstance(self.public_key, rsa.RSAPublicKey):
            raise SystemExit("vertex_stub: the service account's key must be RSA")
        if not client_email:
            raise SystemExit("vertex_stub: --client-email is required (or a client_email in --service-account-file)")
        self.client_email = client_email
        self.lock = threading.Lock()
        self.tokens = {}  # access token -> monotonic expiry
        self.token_endpoint_fails = False
        self.issued_file = args.issued_credentials

    def audiences(self):
        own = [f"https://127.0.0.1:{self.port}/token", f"https://localhost:{self.port}/token"]
        return own + [TOKEN_URL] if self.check_host else own

    def grant(self):
        token = "ya29.stub-" + secrets.token_urlsafe(24)
        with self.lock:
            now = time.monotonic()
            self.tokens = {t: e for t, e in self.tokens.items() if e > now}
            self.tokens[token] = now + self.lifetime
        self.log.count("grants")
        return token

    def token_state(self, token):
        with self.lock:
            expiry = self.tokens.get(token)
        if expiry is None and self.issued_file:
            # A token credentials_stub.py issued (the metadata server's), by its wall-clock expiry.
            try:
                with open(self.issued_file, encoding="utf-8") as f:
                    issued = json.load(f).get("bearer", {}).get(token)
            except (OSError, ValueError):
                issued = None
            if issued is not None:
                return "valid" if time.time() < issued else "expired"
        if expiry is None:
            return "unknown"
        return "valid" if time.monotonic() < expiry else "expired"


class VertexHandler(common.StubHandler):
    server_version = "vertex-stub"

    def send_failure(self, failure):
        kind = failure.kind or ""
        headers = list(failure.headers)
        if kind == "html":  # Google's front end: a host or path it does not serve
            return self.send_whole(404, common.google_html_404(failure.message), headers, content_type="text/html; charset=UTF-8")
        if kind == "anthropic":  # Claude's own refusal, relayed by Vertex in the API's shape
            request_id = "req_vrtx_" + secrets.token_hex(12)
            body = {"type": "error", "error": {"type": "invalid_request_error", "message": failure.message},
                    "request_id": request_id}
            return self.send_whole(failure.status, body, headers + [("request-id", request_id)])
        if kind.startswith("oauth:"):
            body = {"error": kind[len("oauth:"):], "error_description": failure.message}
            if kind == "oauth:internal_failure":
                body = {"error": "internal_failure"}
        elif kind == "upstream":  # the Anthropic stub unreachable or failing
            failure.status = 503
            body = google_error(503, "The service is currently unavailable.")
        else:
            body = google_error(failure.status, failure.message)
        if failure.status == 401 and not kind.startswith("oauth:"):
            headers.append(("WWW-Authenticate", 'Bearer realm="https://accounts.google.com/", error="invalid_token"'))
        self.send_whole(failure.status, body, headers, content_type="application/json; charset=UTF-8")

    def route(self, record):
        path, _, query = self.path.partition("?")
        host = common.host_of(self)
        if self.app.check_host and not path.startswith("/_stub/"):
            record["host"] = host
            served = {TOKEN_HOST: ("/token",), self.app.api_host: ("/v1/",)}.get(host)
            if served is None or not path.startswith(served):
                raise common.HTTPFailure(404, path, kind="html", close=True,
                                         reason=f"Host {host!r} does not serve {path} (API host {self.app.api_host!r}, token host {TOKEN_HOST!r})")
        if path == "/token":
            return self.token(record)
        if path == "/_stub/token-endpoint" and self.command == "POST":
            self.read_body(self.app.max_body)
            fail = parse_qs(query).get("fail", ["1"])[-1]
            self.app.token_endpoint_fails = fail not in ("0", "false", "")
            record.update(control=True, verified=True)
            return self.send_whole(200, {"token_endpoint_fails": self.app.token_endpoint_fails})
        if path == "/_stub/stats" and self.command == "GET":
            record.update(control=True, verified=True)
            log = self.app.log
            return self.send_whole(200, {"grants": log.get("grants"), "requests": log.get("requests"),
                                         "cancelled": log.get("cancelled"), "token_requests": log.get("token_requests")})
        match = PREDICT.match(path)
        if self.command != "POST" or not match:
            raise common.HTTPFailure(404, path, kind="html", close=True, reason=f"no route for {self.command} {path}")
        if unquote(match.group(3)) == "count-tokens":
            if match.group(4) != "rawPredict":
                raise common.HTTPFailure(404, path, kind="html", close=True, reason=f"count-tokens takes rawPredict, not {match.group(4)}")
            return self.count_tokens(record, match.group(1), match.group(2))
        return self.predict(record, *match.groups())

    # MARK: OAuth

    def token(self, record):
        record["grant"] = True
        self.app.log.count("token_requests")
        if self.command != "POST":
            raise common.HTTPFailure(405, "POST only", kind="oauth:invalid_request")
        body = self.read_body(self.app.max_body)
        if self.app.token_endpoint_fails:
            raise common.HTTPFailure(500, "", kind="oauth:internal_failure", reason="scripted token endpoint failure")
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "application/x-www-form-urlencoded":
            raise common.HTTPFailure(400, f"Content-Type {content_type!r} is not application/x-www-form-urlencoded",
                                     kind="oauth:invalid_request")
        try:
            form = parse_qs(body.decode("ascii"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            raise common.HTTPFailure(400, "the body is not a form", kind="oauth:invalid_request")
        record["body"] = {k: (v if k != "assertion" else [f"<{len(x)} characters>" for x in v]) for k, v in form.items()}
        if form.get("grant_type") != [JWT_BEARER]:
            raise common.HTTPFailure(400, f"Invalid grant_type: {form.get('grant_type')}", kind="oauth:unsupported_grant_type")
        assertions = form.get("assertion") or []
        if len(assertions) != 1:
            raise common.HTTPFailure(400, "exactly one assertion is required", kind="oauth:invalid_request")
        try:
            header, claims = verify_assertion(assertions[0], self.app.public_key, self.app.client_email,
                                              self.app.audiences(), int(time.time()))
        except GrantRefused as refusal:
            raise common.HTTPFailure(400, str(refusal), kind="oauth:invalid_grant")
        record.update(verified=True, jwt_header=header, claims=claims)
        token = self.app.grant()
        self.send_whole(200, {"access_token": token, "expires_in": self.app.lifetime, "token_type": "Bearer"},
                        content_type="application/json; charset=utf-8")

    # MARK: Claude on Vertex

    def authorize(self, record, raw_project, raw_region):
        """Google's front end: the access token, the project, the location."""
        values = self.headers.get_all("Authorization") or []
        scheme, _, token = (values[0] if len(values) == 1 else "").partition(" ")
        state = self.app.token_state(token.strip()) if scheme.lower() == "bearer" else "missing"
        if state != "valid":
            raise common.HTTPFailure(401, "Request had invalid authentication credentials. Expected OAuth 2 access token, "
                                     "login cookie or other valid authentication credential.",
                                     reason=f"access token {state}")
        record["verified"] = True
        if unquote(raw_project) != self.app.project:
            raise common.HTTPFailure(404, f"Project `{unquote(raw_project)}` not found or the caller lacks access to it.")
        if unquote(raw_region) != self.app.region:
            raise common.HTTPFailure(404, f"Publisher model in location `{unquote(raw_region)}` was not found.")

    def strict_checks(self, parsed, members, model, record):
        """Claude's own refusals on Vertex: betas outside the accepted list, then top-level members."""
        betas = common.split_betas(self.headers.get_all("anthropic-beta") or [])
        if not self.app.strict:
            return betas
        bad = common.refused_betas(betas, ACCEPTED_BETAS)
        if bad:
            record["refused"] = "beta"
            raise common.HTTPFailure(400, "Unexpected value(s) " + ", ".join(f"`{b}`" for b in bad) + " for the `anthropic-beta` "
                                     "header. Please consult our documentation at docs.anthropic.com or try again without the header.",
                                     kind="anthropic")
        try:
            common.check_members(parsed, members, model, OUTPUT_CONFIG_MODELS, betas)
        except common.Refusal as refusal:
            record["refused"] = refusal.kind
            raise common.HTTPFailure(400, refusal.message, kind="anthropic")
        return betas

    def predict(self, record, raw_project, raw_region, raw_model, method):
        self.app.log.count("requests")
        streaming = method == "streamRawPredict"
        model = unquote(raw_model)
        record.update(model=model, stream=streaming, method_name=method)
        body = self.read_body(self.app.max_body)
        self.authorize(record, raw_project, raw_region)

        try:
            parsed = json.loads(body)
        except ValueError as error:
            raise common.HTTPFailure(400, f"Invalid JSON payload received. {error}")
        record["body"] = parsed
        if not isinstance(parsed, dict):
            raise common.HTTPFailure(400, "Invalid JSON payload received. The body must be an object.")
        if parsed.get("anthropic_version") != VERTEX_VERSION:
            raise common.HTTPFailure(400, f"anthropic_version: must be {VERTEX_VERSION!r}")
        if "model" in parsed:
            raise common.HTTPFailure(400, "model: the model is named in the URL, not in the body")
        betas = self.strict_checks(parsed, PREDICT_MEMBERS, model, record)
        if "denied" in model:
            record["behaviour"] = "denied"
            raise common.HTTPFailure(403, f"Permission 'aiplatform.endpoints.predict' denied on resource "
                                     f"'//aiplatform.googleapis.com/projects/{self.app.project}/locations/{self.app.region}/publishers/anthropic/models/{model}'")
        if "throttle" in model:
            record["behaviour"] = "throttle"
            raise common.HTTPFailure(429, "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model "
                                     f"with base model: {model}. Please submit a quota increase request.")
        if "too-long" in model:
            record["behaviour"] = "too-long"
            raise common.HTTPFailure(400, "prompt is too long: 208310 tokens > 200000 maximum", kind="anthropic")

        forward = {"model": model}
        forward.update((k, v) for k, v in parsed.items() if k != "anthropic_version")
        if streaming:
            forward["stream"] = True
        upstream_body = json.dumps(forward, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        upstream_headers = self.app.upstream.headers(",".join(betas) if betas else None)

        with common.Exchange(self, self.app.upstream, upstream_body, upstream_headers) as exchange:
            response = exchange.response
            record["upstream_status"] = response.status
            headers = [("request-id", "req_vrtx_" + secrets.token_hex(12))]
            if response.getheader("retry-after"):
                headers.append(("retry-after", response.getheader("retry-after")))
            content_type = response.getheader("content-type") or "application/json"
            if not content_type.startswith("text/event-stream"):
                try:
                    data = exchange.read_all()
                except common.UpstreamBroken as error:
                    raise common.HTTPFailure(500, "Internal error encountered.", reason=f"upstream answer cut short: {error}")
                return self.send_whole(response.status, data, headers, content_type=content_type)
            self.start_chunked(response.status, headers, content_type=content_type)
            try:
                for piece in exchange.chunks():
                    self.send_chunk(piece)
            except common.UpstreamBroken as error:
                record["reason"] = f"the Anthropic stub's stream broke: {error}"
                record["upstream_broken"] = True
                self.abort()
                return
            self.end_chunked()

    def count_tokens(self, record, raw_project, raw_region):
        """`…/publishers/anthropic/models/count-tokens:rawPredict`: the Messages API's count_tokens
        body with `model` in it (anthropic-sdk-python lib/vertex/_client.py rewrites
        /v1/messages/count_tokens to this path and keeps the body); the answer is the API's own."""
        self.app.log.count("requests")
        record.update(method_name="count-tokens:rawPredict", operation="count-tokens")
        body = self.read_body(self.app.max_body)
        self.authorize(record, raw_project, raw_region)
        try:
            parsed = json.loads(body)
        except ValueError as error:
            raise common.HTTPFailure(400, f"Invalid JSON payload received. {error}")
        record["body"] = parsed
        if not isinstance(parsed, dict):
            raise common.HTTPFailure(400, "Invalid JSON payload received. The body must be an object.")
        model = parsed.get("model")
        if not isinstance(model, str) or not model:
            raise common.HTTPFailure(400, "model: Field required", kind="anthropic")
        record["model"] = model
        if parsed.get("anthropic_version", VERTEX_VERSION) != VERTEX_VERSION:
            raise common.HTTPFailure(400, f"anthropic_version: must be {VERTEX_VERSION!r}")
        betas = self.strict_checks(parsed, COUNT_MEMBERS, model, record)
        if "throttle" in model:
            record["behaviour"] = "throttle"
            raise common.HTTPFailure(429, "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model "
                                     f"with base model: {model}. Please submit a quota increase request.")
        forward = {k: v for k, v in parsed.items() if k != "anthropic_version"}
        upstream_body = json.dumps(forward, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        headers = self.app.upstream.headers(",".join(betas) if betas else None)
        with common.Exchange(self, self.app.upstream, upstream_body, headers, path=self.app.upstream.count_path) as exchange:
            response = exchange.response
            record["upstream_status"] = response.status
            try:
                data = exchange.read_all()
            except common.UpstreamBroken as error:
                raise common.HTTPFailure(500, "Internal error encountered.", reason=f"upstream answer cut short: {error}")
            self.send_whole(response.status, data, [("request-id", "req_vrtx_" + secrets.token_hex(12))],
                            content_type=response.getheader("content-type") or "application/json")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_arguments(parser)
    parser.add_argument("--project", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--public-key-file", help="PEM public key of the service account")
    parser.add_argument("--service-account-file", help="service account JSON; its private_key gives the public key")
    parser.add_argument("--client-email", help="the service account's email, the JWT's iss")
    parser.add_argument("--token-lifetime", type=int, default=3600, help="seconds an access token is valid (default 3600)")
    parser.add_argument("--issued-credentials", help="credentials_stub.py's --issued file: the bearer tokens it issued (the metadata "
                                                     "server's) are accepted too, until they expire")
    common.run("vertex_stub", parser, VertexApp, VertexHandler)


if __name__ == "__main__":
    main()
