"""One S3 request signed with AWS Signature Version 4, for what the object-store client does not do:
the bundled server's admin API (its users) and bucket policies (agentrun.statestore.principals), and the
local control plane's bucket set-up. Small and synchronous: run it in a thread from async code."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import secrets
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

from .errors import StoreUnavailable

DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Credentials:
    """An access key and its secret; repr() never shows the secret."""

    access_key: str
    secret_key: str

    @classmethod
    def new(cls, access_key: str | None = None) -> S3Credentials:
        """Fresh credentials (a random access key unless one is given)."""
        return cls(access_key or "AR" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))

    def env(self) -> dict[str, str]:
        """The variables an S3 client (obstore, the AWS CLI and SDKs) reads its credentials from."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def __repr__(self) -> str:
        return f"S3Credentials(access_key={self.access_key!r}, secret_key=...)"


def signed_request(
    method: str,
    endpoint: str,
    path: str,
    *,
    credentials: S3Credentials,
    query: Mapping[str, str] | None = None,
    body: bytes = b"",
    region: str = DEFAULT_REGION,
    timeout: float = 10.0,
    service: str = "s3",
    extra_headers: Mapping[str, str] | None = None,
    session_token: str | None = None,
) -> tuple[int, bytes]:
    """One path-style request to `endpoint` (http(s)://host[:port]); (status, body), error answers
    included. A server that does not answer raises StoreUnavailable. `service` is the signature's
    service ("iam" for an IAM API); `extra_headers` are sent and signed besides (lower-case names);
    `session_token`: temporary credentials' token (AWS_SESSION_TOKEN), sent and signed as
    x-amz-security-token."""
    host = endpoint.split("://", 1)[1].rstrip("/")
    now = datetime.datetime.now(datetime.UTC)  # clock-exempt: a request signature is the real time
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    canonical_path = quote(path, safe="/-_.~")
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted((query or {}).items())
    )
    payload_hash = hashlib.sha256(body).hexdigest()
    headers = {
        **(extra_headers or {}),
        "host": host,
        "x-amz-content-sha256": payload_hash,
        "x-amz-date": amz_date,
    }
    if session_token:
        headers["x-amz-security-token"] = session_token
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            method,
            canonical_path,
            canonical_query,
            "".join(f"{name}:{headers[name]}\n" for name in sorted(headers)),
            signed,
            payload_hash,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + credentials.secret_key).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    url = endpoint.rstrip("/") + canonical_path + (f"?{canonical_query}" if canonical_query else "")
    request = urllib.request.Request(url, data=body or None, method=method)
    for name, value in headers.items():
        if name != "host":
            request.add_header(name, value)
    request.add_header(
        "Authorization",
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, SignedHeaders={signed}, "
        f"Signature={signature}",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        raise StoreUnavailable(method, endpoint + path, str(error)) from None


def transient_status(status: int) -> bool:
    """Whether an S3 answer's status is worth another try: 408, 429 and 5xx (as classify() has it)."""
    return status in (408, 429) or 500 <= status <= 599


def xml_local_name(tag: str) -> str:
    """An XML element's name without its namespace (S3 answers name one, or none)."""
    return tag.rsplit("}", 1)[-1]
