#!/usr/bin/env python3
"""Microsoft Foundry's and Claude Platform on AWS's Messages API, over TLS, for tests.

Both take the Anthropic Messages API at their own path with their own auth, and this stub checks
what each is documented and reported to check before it forwards the request to the Anthropic
stub and relays the answer unchanged (JSON or SSE):

- `--service foundry`: `POST /anthropic/v1/messages` (and `/count_tokens`), the API key in
  `x-api-key` (Microsoft's "Deploy and use Claude models in Microsoft Foundry": the key, or an
  Entra ID token as `Authorization: Bearer`, which `--bearer-token-file` accepts), `model` the
  name of one of the resource's deployments (`--deployment NAME=MODEL`: any other answers Azure's
  404 DeploymentNotFound), `anthropic-version: 2023-06-01`, and only the betas Foundry takes
  (litellm's anthropic_beta_headers_config.json, block azure_ai); a wrong key answers Azure's 401
  `{"error":{"code":"401","message":"Access denied due to invalid subscription key…"}}`.
- `--service claude-platform-aws`: `POST /v1/messages`, the `anthropic-workspace-id` header
  naming `--anthropic-workspace-id` (Claude Platform on AWS documentation; the Anthropic SDK's
  AnthropicAWS client sends it), and either an API key in `x-api-key` (`--api-key-file`) or a
  SigV4 signature for the service `aws-external-anthropic` in `--region` (verified with
  botocore, as bedrock_stub.py does for `bedrock`); a request without one is AWS's 403
  `MissingAuthenticationTokenException`.

    compatible_stub.py --service foundry|claude-platform-aws|bedrock-mantle --cert server.pem --key server.key \\
        --anthropic-url http://127.0.0.1:PORT --anthropic-key KEY [--api-key-file FILE] \\
        [--deployment NAME=MODEL]… [--region R --anthropic-workspace-id ID --access-key-id AKID \\
        --secret-key-file FILE [--session-token-file FILE]] [--log requests.jsonl] [--port N] [--lenient]

- `--service bedrock-mantle`: `POST /anthropic/v1/messages`, SigV4 for `bedrock-mantle` (the
  Anthropic SDK's Bedrock Mantle client signs for that service at bedrock-mantle.{region}.api.aws).

It prints `PORT <n>` once listening. A model (deployment) whose name contains `overloaded`
answers 529, `throttle` 429, without forwarding.
"""

import argparse
import hmac
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import bedrock_stub  # noqa: E402  (its SigV4 verification, for another service name)

MESSAGES_VERSION = "2023-06-01"
SIGNING_SERVICE = "aws-external-anthropic"

# The members the Messages API defines (what Foundry's and Anthropic's own front ends parse).
MESSAGES_MEMBERS = {
    "model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p", "top_k", "tools", "tool_choice",
    "thinking", "stream", "metadata", "output_config", "context_management", "mcp_servers", "container", "cache_control",
}
# Foundry's betas: litellm's anthropic_beta_headers_config.json, block azure_ai, its non-null entries.
FOUNDRY_BETAS = {
    "advanced-tool-use-2025-11-20", "code-execution-2025-08-25", "computer-use-2025-01-24", "computer-use-2025-11-24",
    "context-1m-2025-08-07", "context-management-2025-06-27", "dangerous-tool-use-2026-09-03", "effort-2025-11-24",
    "files-api-2025-04-14", "interleaved-thinking-2025-05-14", "mcp-client-2025-11-20", "mcp-client-2025-04-04",
    "per-turn-control-2026-07-01", "prompt-caching-scope-2026-01-05", "skills-2025-10-02", "structured-outputs-2025-11-13",
    "thinking-display-updates-2026-08-18", "web-fetch-2025-09-10", "web-search-2025-03-05",
}


def api_error(status, kind, message):
    return {"type": "error", "error": {"type": kind, "message": message}}


class CompatibleApp(common.App):
    def __init__(self, args):
        super().__init__(args)
        self.service = args.service
        self.api_key = bedrock_stub.read_secret(args.api_key_file) if args.api_key_file else None
        self.bearer = bedrock_stub.read_secret(args.bearer_token_file) if args.bearer_token_file else None
        self.deployments = dict(entry.split("=", 1) for entry in args.deployment)
        self.workspace_id = args.anthropic_workspace_id
        # What bedrock_stub.verify_sigv4 reads of its app.
        self.region = args.region
        self.access_key_id = args.access_key_id
        self.secret = bedrock_stub.read_secret(args.secret_key_file) if args.secret_key_file else None
        self.session_token = bedrock_stub.read_secret(args.session_token_file) if args.session_token_file else None
        # credentials_stub.py's --issued file: the keys and Entra ID tokens it issued, until they expire.
        self.issued_file = args.issued_credentials

    def issued_bearer(self, token):
        """'valid', 'expired' or None for a bearer token credentials_stub.py issued."""
        if not self.issued_file:
            return None
        try:
            with open(self.issued_file, encoding="utf-8") as f:
                expires = json.load(f).get("bearer", {}).get(token)
        except (OSError, ValueError):
            return None
        if expires is None:
            return None
        return "valid" if time.time() < expires else "expired"

    credentials_for = bedrock_stub.BedrockApp.credentials_for


class CompatibleHandler(common.StubHandler):
    server_version = "compatible-stub"

    def send_failure(self, failure):
        if failure.kind == "azure":
            return self.send_whole(failure.status, {"error": {"code": str(failure.status) if failure.status == 401 else "DeploymentNotFound",
                                                              "message": failure.message}}, [("apim-request-id", common.request_id())])
        if failure.kind and failure.kind.endswith("Exception"):
            return self.send_whole(failure.status, {"message": failure.message},
                                   [("x-amzn-RequestId", common.request_id()), ("x-amzn-ErrorType", failure.kind)])
        kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}.get(failure.status, "api_error")
        self.send_whole(failure.status, api_error(failure.status, kind, failure.message), [("request-id", "req_" + common.request_id())])

    def refuse(self, message, reason=None):
        return common.HTTPFailure(400, message, reason=reason or message)

    def route(self, record):
        path = self.path.split("?", 1)[0]
        prefix = "/anthropic" if self.app.service in ("foundry", "bedrock-mantle") else ""
        if self.command != "POST" or path not in (prefix + "/v1/messages", prefix + "/v1/messages/count_tokens"):
            raise common.HTTPFailure(404, f"no route for {self.command} {path}", close=True)
        counts = path.endswith("/count_tokens")
        body = self.read_body(self.app.max_body)
        if self.app.service == "foundry":
            self.foundry_auth(record)
        else:
            self.aws_auth(body, record)
        if self.app.service == "bedrock-mantle" and counts:
            raise common.HTTPFailure(404, "no count_tokens on bedrock-mantle", kind="UnknownOperationException")
        record["verified"] = True
        versions = self.headers.get_all("anthropic-version") or []
        if versions != [MESSAGES_VERSION]:
            raise self.refuse(f"anthropic-version: header is required and must be {MESSAGES_VERSION}")
        try:
            parsed = json.loads(body)
        except ValueError as error:
            raise self.refuse(f"the request body is not JSON: {error}")
        if not isinstance(parsed, dict):
            raise self.refuse("the request body must be a JSON object")
        record["body"] = parsed
        model = parsed.get("model")
        if not isinstance(model, str) or not model:
            raise self.refuse("model: Field required")
        record["model"] = model
        betas = common.split_betas(self.headers.get_all("anthropic-beta") or [])
        if self.app.strict:
            unknown = sorted(set(parsed) - MESSAGES_MEMBERS)
            if unknown:
                raise self.refuse(f"{unknown[0]}: Extra inputs are not permitted")
            if self.app.service == "foundry":
                refused = [beta for beta in betas if beta not in FOUNDRY_BETAS]
                if refused:
                    raise self.refuse(f"Unsupported beta header: {refused[0]}")
        if self.app.service == "foundry":
            if model not in self.app.deployments:
                raise common.HTTPFailure(404, "The API deployment for this resource does not exist. If you created the deployment within "
                                         "the last 5 minutes, please wait a moment and try again.", kind="azure")
            parsed["model"] = self.app.deployments[model]
        if "overloaded" in model:
            raise common.HTTPFailure(529, "Overloaded", reason="scripted: overloaded")
        if "throttle" in model:
            raise common.HTTPFailure(429, "Too many requests", reason="scripted: throttle")
        record["stream"] = bool(parsed.get("stream"))
        upstream_body = json.dumps(parsed, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        headers = self.app.upstream.headers(",".join(betas) if betas else None)
        upstream_path = self.app.upstream.count_path if counts else None
        with common.Exchange(self, self.app.upstream, upstream_body, headers, path=upstream_path) as exchange:
            response = exchange.response
            record["upstream_status"] = response.status
            content_type = response.getheader("content-type") or "application/json"
            answer_headers = [("request-id", response.getheader("request-id") or "req_" + common.request_id())]
            if not content_type.startswith("text/event-stream"):
                return self.send_whole(response.status, exchange.read_all(), answer_headers, content_type=content_type)
            self.start_chunked(response.status, answer_headers, content_type=content_type)
            try:
                for piece in exchange.chunks():
                    self.send_chunk(piece)
            except common.UpstreamBroken as error:
                record["reason"] = f"the Anthropic stub's stream broke: {error}"
                self.abort()
                return
            self.end_chunked()

    def foundry_auth(self, record):
        keys = self.headers.get_all("x-api-key") or []
        bearer = self.headers.get_all("Authorization") or []
        if len(keys) == 1 and self.app.api_key is not None and hmac.compare_digest(keys[0].encode(), self.app.api_key.encode()):
            record["auth"] = "api-key"
            return
        if len(bearer) == 1 and self.app.bearer is not None and bearer[0].startswith("Bearer ") \
                and hmac.compare_digest(bearer[0][7:].encode(), self.app.bearer.encode()):
            record["auth"] = "bearer"
            return
        if len(bearer) == 1 and bearer[0].startswith("Bearer ") and self.app.issued_bearer(bearer[0][7:]) == "valid":
            record["auth"] = "entra"
            return
        raise common.HTTPFailure(401, "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid "
                                 "key for an active subscription and use a correct regional API endpoint for your resource.",
                                 kind="azure", reason="no valid key")

    def aws_auth(self, body, record):
        service = SIGNING_SERVICE if self.app.service == "claude-platform-aws" else "bedrock-mantle"
        ids = self.headers.get_all("anthropic-workspace-id") or []
        if service == "bedrock-mantle":
            pass  # bedrock-mantle has no Anthropic workspace
        elif len(ids) != 1 or ids[0] != self.app.workspace_id:
            raise self.refuse("anthropic-workspace-id: header is required and must name a workspace of this organization",
                              reason=f"anthropic-workspace-id {ids}")
        keys = self.headers.get_all("x-api-key") or []
        if keys:
            if len(keys) == 1 and self.app.api_key is not None and hmac.compare_digest(keys[0].encode(), self.app.api_key.encode()):
                record["auth"] = "api-key"
                return
            raise common.HTTPFailure(401, "invalid x-api-key", reason="wrong API key")
        if not self.headers.get_all("Authorization"):
            raise common.HTTPFailure(403, "Missing Authentication Token", kind="MissingAuthenticationTokenException", reason="no auth")
        # A SignatureFailure is AWS's 403 with its exception in x-amzn-ErrorType (send_failure).
        bedrock_stub.SERVICE = service
        bedrock_stub.verify_sigv4(self, self.app, body, record)
        record["auth"] = "sigv4"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_arguments(parser)
    parser.add_argument("--service", required=True, choices=["foundry", "claude-platform-aws", "bedrock-mantle"])
    parser.add_argument("--api-key-file", help="file holding the API key accepted in x-api-key")
    parser.add_argument("--bearer-token-file", help="file holding a bearer token accepted in Authorization (Foundry: an Entra ID token)")
    parser.add_argument("--deployment", action="append", default=[], help="a Foundry deployment: NAME=MODEL (the model the Anthropic stub gets)")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--anthropic-workspace-id")
    parser.add_argument("--access-key-id", default="")
    parser.add_argument("--secret-key-file")
    parser.add_argument("--session-token-file")
    parser.add_argument("--issued-credentials", help="credentials_stub.py's --issued file: the AWS keys and bearer tokens it issued are "
                                                     "accepted too, until they expire")
    common.run("compatible_stub", parser, CompatibleApp, CompatibleHandler)


if __name__ == "__main__":
    main()
