#!/usr/bin/env python3
"""The clouds' credential endpoints, over plain HTTP on 127.0.0.1, for tests.

One server plays every endpoint a renewing credential comes from, each as strict as its cloud:

- AWS STS (`POST /`): `AssumeRoleWithWebIdentity` (the token must be the one in
  `--web-identity-token-file`, read on each request, for `--role-arn`) and `AssumeRole` (signed
  with SigV4 for `sts`, checked with botocore, by credentials this stub issued, for
  `--assume-role-arn`); answers STS's XML, errors included.
- ECS/EKS container credentials (`GET /container/credentials`): `Authorization` must be the
  token in `--container-token-file`.
- EC2's IMDSv2: `PUT /latest/api/token` (with `X-aws-ec2-metadata-token-ttl-seconds`) gives a
  session token; `GET /latest/meta-data/iam/security-credentials/` and `…/{role}` refuse (401)
  a request without a valid one.
- Google's metadata server (`GET /computeMetadata/v1/instance/service-accounts/default/token`,
  `Metadata-Flavor: Google` required and answered).
- Microsoft Entra ID's token endpoint (`POST /{tenant}/oauth2/v2.0/token`): the client
  credentials grant with `--client-secret-file`'s secret, or with a client assertion whose RS256
  signature is checked with `--client-certificate-file`'s public key, its `x5t#S256` with the
  certificate's thumbprint, `aud` (this endpoint's URL), `iss` and `sub` (the client) and its
  times; and managed identity on IMDS (`GET /metadata/identity/oauth2/token`, `Metadata: true`)
  and App Service (`GET /msi/token`, `X-IDENTITY-HEADER` must be `--identity-header`).

Every credential lives `--lifetime` seconds. What was issued goes to `--issued FILE` (JSON,
replaced whole at each change), which the Bedrock and Vertex stubs read to accept it and to
refuse it once expired. `POST /_stub/fail?endpoint=NAME&on=1` makes one endpoint (`sts`,
`container`, `imds`, `metadata`, `entra`, `managed`, or `all`) answer 500 until `on=0`;
`POST /_stub/revoke` forgets everything issued (the clouds then refuse it). It prints `PORT <n>`.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MAX_BODY = 64 * 1024


def b64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def read_file(path):
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


class Refused(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.aws = {}      # access key id -> {secret, token, expires}
        self.bearer = {}   # token -> expires
        self.imds_tokens = {}
        self.failing = set()
        self.counts = {}
        self.log_file = open(args.log, "a", encoding="utf-8") if args.log else None
        self.write_issued()

    def write_issued(self):
        if not self.args.issued:
            return
        data = json.dumps({"aws": self.aws, "bearer": self.bearer})
        temporary = self.args.issued + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(data)
        os.replace(temporary, self.args.issued)

    def issue_aws(self, endpoint):
        akid = "ASIA" + secrets.token_hex(8).upper()
        entry = {"secret": secrets.token_urlsafe(30), "token": "IQoJ" + secrets.token_urlsafe(60),
                 "expires": int(time.time()) + self.args.lifetime}
        with self.lock:
            now = time.time()
            self.aws = {k: v for k, v in self.aws.items() if v["expires"] > now - 60}
            self.aws[akid] = entry
            self.write_issued()
        return akid, entry

    def issue_bearer(self, prefix):
        token = prefix + secrets.token_urlsafe(40)
        expires = int(time.time()) + self.args.lifetime
        with self.lock:
            now = time.time()
            self.bearer = {k: v for k, v in self.bearer.items() if v > now - 60}
            self.bearer[token] = expires
            self.write_issued()
        return token, expires

    def count(self, name):
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + 1

    def log(self, record):
        if self.log_file:
            with self.lock:
                self.log_file.write(json.dumps(record, separators=(",", ":")) + "\n")
                self.log_file.flush()


def iso(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def sts_error(code, message, status=403):
    return Refused(status, code, message)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "credentials-stub"

    def log_message(self, *args):
        pass

    @property
    def state(self):
        return self.server.state

    def reply(self, status, body, content_type="application/json", headers=()):
        data = body if isinstance(body, bytes) else (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def dispatch(self, method):
        path = urlsplit(self.path).path
        record = {"method": method, "path": path}
        # Logged before the answer goes out, so a test that has its answer finds it in the log.
        try:
            endpoint, answer = self.route(method, path, record)
            record["endpoint"] = endpoint
            record["status"] = answer[0]
            self.state.log(record)
            self.reply(*answer)
        except Refused as refusal:
            record["status"] = refusal.status
            record["refused"] = f"{refusal.code}: {refusal.message}"
            self.state.log(record)
            if record.get("endpoint") == "sts":
                body = (f'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>'
                        f'<Code>{refusal.code}</Code><Message>{refusal.message}</Message></Error>'
                        f'<RequestId>{secrets.token_hex(8)}</RequestId></ErrorResponse>')
                self.reply(refusal.status, body, "text/xml")
            else:
                self.reply(refusal.status, {"error": refusal.code, "error_description": refusal.message})

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def failing(self, endpoint, record):
        record["endpoint"] = endpoint
        self.state.count(endpoint)
        if endpoint in self.state.failing or "all" in self.state.failing:
            raise Refused(500, "InternalFailure", f"the {endpoint} endpoint is failing (test)")

    def route(self, method, path, record):
        query = parse_qs(urlsplit(self.path).query)
        if path == "/_stub/fail" and method == "POST":
            endpoint = query.get("endpoint", ["all"])[0]
            on = query.get("on", ["1"])[0] not in ("0", "false")
            with self.state.lock:
                (self.state.failing.add if on else self.state.failing.discard)(endpoint)
            return "control", (200, {"failing": sorted(self.state.failing)})
        if path == "/_stub/revoke" and method == "POST":
            with self.state.lock:
                self.state.aws, self.state.bearer = {}, {}
                self.state.write_issued()
            return "control", (200, {"revoked": True})
        if path == "/_stub/counts":
            with self.state.lock:
                return "control", (200, dict(self.state.counts))
        if path == "/" and method == "POST":
            self.failing("sts", record)
            return "sts", self.sts(record)
        if path == "/container/credentials" and method == "GET":
            self.failing("container", record)
            return "container", self.container()
        if path.startswith("/latest/"):
            self.failing("imds", record)
            return "imds", self.imds(method, path)
        if path == "/computeMetadata/v1/instance/service-accounts/default/token" and method == "GET":
            self.failing("metadata", record)
            if self.headers.get("Metadata-Flavor") != "Google":
                raise Refused(403, "Forbidden", "Missing Metadata-Flavor:Google header")
            token, expires = self.state.issue_bearer("ya29.metadata-")
            return "metadata", (200, {"access_token": token, "expires_in": expires - int(time.time()), "token_type": "Bearer"},
                                "application/json", [("Metadata-Flavor", "Google")])
        if path.endswith("/oauth2/v2.0/token") and method == "POST":
            self.failing("entra", record)
            return "entra", self.entra(path, record)
        if path == "/metadata/identity/oauth2/token" and method == "GET":
            self.failing("managed", record)
            if self.headers.get("Metadata") != "true":
                raise Refused(400, "invalid_request", "Required metadata header not specified")
            return "managed", self.managed(query, string_expires_in=True)
        if path == "/msi/token" and method == "GET":
            self.failing("managed", record)
            if not hmac.compare_digest((self.headers.get("X-IDENTITY-HEADER") or "").encode(), (self.state.args.identity_header or "-").encode()):
                raise Refused(401, "unauthorized", "X-IDENTITY-HEADER is missing or wrong")
            return "managed", self.managed(query, string_expires_in=False)
        raise Refused(404, "NotFound", f"no route for {method} {path}")

    # AWS

    def sts(self, record):
        record["endpoint"] = "sts"
        form = {k: v[0] for k, v in parse_qs(self.read_body().decode("utf-8", "replace"), keep_blank_values=True).items()}
        action = form.get("Action")
        record["action"] = action
        if form.get("Version") != "2011-06-15":
            raise sts_error("InvalidAction", f"Version {form.get('Version')!r} is not 2011-06-15", 400)
        if not form.get("RoleSessionName"):
            raise sts_error("ValidationError", "RoleSessionName is required", 400)
        if action == "AssumeRoleWithWebIdentity":
            if form.get("RoleArn") != self.state.args.role_arn:
                raise sts_error("AccessDenied", f"Not authorized to perform sts:AssumeRoleWithWebIdentity on {form.get('RoleArn')}")
            expected = read_file(self.state.args.web_identity_token_file)
            if not hmac.compare_digest((form.get("WebIdentityToken") or "").encode(), expected.encode()):
                raise sts_error("InvalidIdentityToken", "Couldn't retrieve verification key from your identity provider")
            if self.headers.get("Authorization"):
                raise sts_error("InvalidAction", "AssumeRoleWithWebIdentity is not signed", 400)
        elif action == "AssumeRole":
            self.verify_sts_signature(record)
            if form.get("RoleArn") != self.state.args.assume_role_arn:
                raise sts_error("AccessDenied", f"Not authorized to perform sts:AssumeRole on {form.get('RoleArn')}")
        else:
            raise sts_error("InvalidAction", f"Could not find operation {action}", 400)
        akid, entry = self.state.issue_aws("sts")
        record["issued"] = akid
        result = f"{action}Result"
        xml = (f'<{action}Response xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><{result}>'
               f'<Credentials><AccessKeyId>{akid}</AccessKeyId><SecretAccessKey>{entry["secret"]}</SecretAccessKey>'
               f'<SessionToken>{entry["token"]}</SessionToken><Expiration>{iso(entry["expires"])}</Expiration></Credentials>'
               f'<AssumedRoleUser><Arn>{form.get("RoleArn")}/x</Arn><AssumedRoleId>AROA:x</AssumedRoleId></AssumedRoleUser>'
               f'</{result}><ResponseMetadata><RequestId>{secrets.token_hex(8)}</RequestId></ResponseMetadata></{action}Response>')
        return 200, xml, "text/xml"

    def verify_sts_signature(self, record):
        authorization = self.headers.get("Authorization") or ""
        if not authorization.startswith("AWS4-HMAC-SHA256 "):
            raise sts_error("MissingAuthenticationToken", "Request is missing Authentication Token", 403)
        fields = dict(part.strip().split("=", 1) for part in authorization[len("AWS4-HMAC-SHA256 "):].split(","))
        akid, date, region, service, _ = fields["Credential"].split("/")
        record["signed_by"] = akid
        with self.state.lock:
            entry = self.state.aws.get(akid)
        if entry is None:
            raise sts_error("InvalidClientTokenId", "The security token included in the request is invalid.")
        if entry["expires"] <= time.time():
            raise sts_error("ExpiredToken", "The security token included in the request is expired")
        if service != "sts":
            raise sts_error("SignatureDoesNotMatch", f"Credential should be scoped to correct service: 'sts', not {service!r}")
        if self.headers.get("X-Amz-Security-Token") != entry["token"] or "x-amz-security-token" not in fields["SignedHeaders"].split(";"):
            raise sts_error("InvalidClientTokenId", "The security token included in the request is invalid.")
        request = AWSRequest(method="POST", url=f"http://{self.headers['Host']}{self.path}", data=self.last_body)
        for name in fields["SignedHeaders"].split(";"):
            request.headers[name] = self.headers[name]
        request.context["timestamp"] = self.headers["X-Amz-Date"]
        signer = SigV4Auth(Credentials(akid, entry["secret"], entry["token"]), "sts", region)
        expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
        if not hmac.compare_digest(expected, fields["Signature"]):
            raise sts_error("SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided.")
        record["verified"] = True

    def read_body(self):
        """The body, bounded, kept for AssumeRole's signature check."""
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise Refused(413, "TooLarge", "body too large")
        self.last_body = self.rfile.read(length)
        return self.last_body

    def aws_json(self, code=None):
        akid, entry = self.state.issue_aws("json")
        body = {"AccessKeyId": akid, "SecretAccessKey": entry["secret"], "Token": entry["token"], "Expiration": iso(entry["expires"])}
        if code:
            body = {"Code": code, "LastUpdated": iso(time.time()), "Type": "AWS-HMAC", **body}
        return 200, body

    def container(self):
        expected = read_file(self.state.args.container_token_file)
        if not hmac.compare_digest((self.headers.get("Authorization") or "").encode(), expected.encode()):
            raise Refused(403, "AccessDenied", "the authorization token is missing or wrong")
        return self.aws_json()

    def imds(self, method, path):
        if path == "/latest/api/token":
            if method != "PUT":
                raise Refused(405, "MethodNotAllowed", "the token takes PUT")
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds") or ""
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                raise Refused(400, "BadRequest", "X-aws-ec2-metadata-token-ttl-seconds must be 1 to 21600")
            token = "AQAE" + secrets.token_urlsafe(30)
            with self.state.lock:
                self.state.imds_tokens[token] = time.time() + int(ttl)
            return 200, token, "text/plain"
        token = self.headers.get("X-aws-ec2-metadata-token") or ""
        with self.state.lock:
            valid = self.state.imds_tokens.get(token, 0) > time.time()
        if not valid:
            raise Refused(401, "Unauthorized", "IMDSv2 requires a session token")
        base = "/latest/meta-data/iam/security-credentials/"
        if path == base:
            return 200, self.state.args.imds_role + "\n", "text/plain"
        if path == base + self.state.args.imds_role:
            return self.aws_json(code="Success")
        raise Refused(404, "NotFound", path)

    # Azure

    def entra(self, path, record):
        args = self.state.args
        tenant = path.split("/")[1]
        form = {k: v[0] for k, v in parse_qs(self.read_body().decode("utf-8", "replace"), keep_blank_values=True).items()}
        if tenant != args.tenant:
            raise Refused(400, "invalid_request", f"AADSTS90002: Tenant '{tenant}' not found.")
        if form.get("grant_type") != "client_credentials":
            raise Refused(400, "unsupported_grant_type", f"grant_type {form.get('grant_type')!r}")
        if form.get("client_id") != args.client_id:
            raise Refused(400, "unauthorized_client", f"AADSTS700016: Application '{form.get('client_id')}' was not found")
        if form.get("scope") != args.scope:
            raise Refused(400, "invalid_scope", f"AADSTS1002012: scope {form.get('scope')!r} is not {args.scope!r}")
        if "client_secret" in form:
            record["auth"] = "secret"
            if not args.client_secret_file or not hmac.compare_digest(form["client_secret"].encode(), read_file(args.client_secret_file).encode()):
                raise Refused(401, "invalid_client", "AADSTS7000215: Invalid client secret provided.")
        elif "client_assertion" in form:
            record["auth"] = "certificate"
            if form.get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer":
                raise Refused(400, "invalid_request", "client_assertion_type")
            self.verify_assertion(form["client_assertion"], f"http://{self.headers['Host']}{path}")
        else:
            raise Refused(401, "invalid_client", "AADSTS7000216: client_assertion, client_secret or request is required")
        token, expires = self.state.issue_bearer("eyJ0eXAi.entra-")
        record["issued"] = True
        return 200, {"token_type": "Bearer", "expires_in": expires - int(time.time()), "ext_expires_in": 3599, "access_token": token}

    def verify_assertion(self, assertion, audience):
        with open(self.state.args.client_certificate_file, "rb") as f:
            certificate = x509.load_pem_x509_certificate(f.read())
        parts = assertion.split(".")
        if len(parts) != 3:
            raise Refused(401, "invalid_client", "AADSTS50027: JWT token is invalid or malformed.")
        header, claims = json.loads(b64url(parts[0])), json.loads(b64url(parts[1]))
        der = certificate.public_bytes(serialization.Encoding.DER)
        thumbprint = base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()
        if header.get("alg") != "RS256" or header.get("x5t#S256") != thumbprint:
            raise Refused(401, "invalid_client", f"AADSTS700027: the certificate with thumbprint {header.get('x5t#S256')} is not registered")
        sha1 = base64.urlsafe_b64encode(hashlib.sha1(der).digest()).rstrip(b"=").decode()
        if "x5t" in header and header["x5t"] != sha1:
            raise Refused(401, "invalid_client", "AADSTS700027: x5t does not match")
        try:
            certificate.public_key().verify(b64url(parts[2]), f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            raise Refused(401, "invalid_client", "AADSTS700027: Client assertion contains an invalid signature.")
        now = time.time()
        if claims.get("aud") != audience:
            raise Refused(401, "invalid_client", f"AADSTS700021: aud {claims.get('aud')!r} is not {audience!r}")
        if claims.get("iss") != self.state.args.client_id or claims.get("sub") != self.state.args.client_id:
            raise Refused(401, "invalid_client", "AADSTS700023: iss and sub must be the client ID")
        exp, nbf = claims.get("exp"), claims.get("nbf", 0)
        if type(exp) is not int or exp <= now or exp > now + 3600 or nbf > now + 60 or not claims.get("jti"):
            raise Refused(401, "invalid_client", "AADSTS700024: Client assertion is not within its valid time range.")

    def managed(self, query, string_expires_in):
        resource = query.get("resource", [""])[0]
        if resource + "/.default" != self.state.args.scope:
            raise Refused(400, "invalid_resource", f"resource {resource!r}")
        if self.state.args.client_id and query.get("client_id", [self.state.args.client_id])[0] != self.state.args.client_id:
            raise Refused(400, "invalid_request", "Identity not found")
        token, expires = self.state.issue_bearer("eyJ0eXAi.managed-")
        body = {"access_token": token, "expires_on": str(expires), "resource": resource, "token_type": "Bearer"}
        if string_expires_in:
            body["expires_in"] = str(expires - int(time.time()))
        return 200, body


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--issued", help="write what was issued here (JSON), for the cloud stubs")
    parser.add_argument("--log", help="append one JSON object per request")
    parser.add_argument("--lifetime", type=int, default=3600)
    parser.add_argument("--role-arn", default="arn:aws:iam::123456789012:role/relay")
    parser.add_argument("--assume-role-arn", default="arn:aws:iam::123456789012:role/bedrock")
    parser.add_argument("--web-identity-token-file")
    parser.add_argument("--container-token-file")
    parser.add_argument("--imds-role", default="relay-instance-role")
    parser.add_argument("--tenant", default="contoso.onmicrosoft.com")
    parser.add_argument("--client-id", default="")
    parser.add_argument("--client-secret-file")
    parser.add_argument("--client-certificate-file")
    parser.add_argument("--scope", default="https://cognitiveservices.azure.com/.default")
    parser.add_argument("--identity-header")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.state = State(args)
    common.serve(server, "credentials_stub")


if __name__ == "__main__":
    main()
