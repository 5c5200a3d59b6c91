"""A minimal S3 client: the calls durable checkpoints need, signed with AWS Signature Version 4, on
the standard library (docs/trainer.md, "Checkpoints in object storage", says why not boto3).

Addressing is path-style (`<endpoint>/<bucket>/<key>`), which S3 and every S3-compatible store
accept; each payload is signed by its SHA-256. `sign` is pure (tested against AWS's published
example); `S3Client` does one HTTP request per call on a fresh connection.

Errors: `S3Error` carries the HTTP status and S3's own error code and message; `S3Unreachable` says
no answer came (refused, reset, timed out). No other exception of the transport leaves the module.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import time
import urllib.parse
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_NAMESPACE = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    session_token: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Credentials | None:
        """The standard AWS variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optionally
        `AWS_SESSION_TOKEN`), as the operator sets them from the job's Secret; None when unset."""
        access, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
        if not access or not secret:
            return None
        return cls(access, secret, env.get("AWS_SESSION_TOKEN", ""))


class S3Error(Exception):
    """The store answered with an error."""

    def __init__(self, status: int, code: str, message: str, what: str) -> None:
        super().__init__(f"{what}: HTTP {status} {code}: {message}".rstrip(": "))
        self.status, self.code = status, code


class S3Unreachable(Exception):
    """No answer from the store (connection refused or broken, or timed out)."""


def _quote(value: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(value, safe=safe)


def sign(
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    payload_sha256: str,
    credentials: Credentials,
    region: str,
    amz_date: str,
) -> dict[str, str]:
    """The headers that sign the request (Signature Version 4 for service `s3`): `headers` plus
    host, x-amz-date, x-amz-content-sha256, the session token if any, and Authorization. `path` is
    already URI-encoded; `amz_date` is `YYYYMMDDTHHMMSSZ`."""
    signed = {name.lower(): " ".join(value.split()) for name, value in headers.items()}
    signed |= {"host": host, "x-amz-date": amz_date, "x-amz-content-sha256": payload_sha256}
    if credentials.session_token:
        signed["x-amz-security-token"] = credentials.session_token
    names = sorted(signed)
    canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))
    canonical = "\n".join(
        [
            method,
            path,
            canonical_query,
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    day = amz_date[:8]
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{credentials.secret_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    authorization = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return {**{k: v for k, v in signed.items() if k != "host"}, "authorization": authorization}


class S3Client:
    """One S3-compatible endpoint (`http(s)://host[:port]`), one set of credentials."""

    def __init__(
        self, endpoint: str, credentials: Credentials, region: str = "us-east-1", timeout: float = 30.0
    ) -> None:
        parsed = urllib.parse.urlsplit(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not an http(s) endpoint: {endpoint!r}")
        self.endpoint, self.credentials, self.region, self.timeout = endpoint, credentials, region, timeout
        self._https, self._host = parsed.scheme == "https", parsed.netloc

    def head_bucket(self, bucket: str) -> None:
        self._request("HEAD", bucket)

    def create_bucket(self, bucket: str) -> None:
        self._request("PUT", bucket)

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        self._request("PUT", bucket, key, body=data)

    def get_object(self, bucket: str, key: str) -> bytes:
        return self._request("GET", bucket, key)

    def delete_object(self, bucket: str, key: str) -> None:
        self._request("DELETE", bucket, key)

    def list_keys(self, bucket: str, prefix: str) -> list[str]:
        """Every key under `prefix` (ListObjectsV2, page after page)."""
        keys: list[str] = []
        token = ""
        while True:
            query = {"list-type": "2", "prefix": prefix} | ({"continuation-token": token} if token else {})
            root = _xml(self._request("GET", bucket, query=query), f"list s3://{bucket}/{prefix}")
            keys += [item.findtext(f"{_NAMESPACE}Key", "") for item in root.iter(f"{_NAMESPACE}Contents")]
            token = root.findtext(f"{_NAMESPACE}NextContinuationToken", "")
            if root.findtext(f"{_NAMESPACE}IsTruncated", "false") != "true" or not token:
                return keys

    def create_multipart_upload(self, bucket: str, key: str) -> str:
        root = _xml(self._request("POST", bucket, key, query={"uploads": ""}), f"upload s3://{bucket}/{key}")
        return root.findtext(f"{_NAMESPACE}UploadId", "")

    def upload_part(self, bucket: str, key: str, upload_id: str, number: int, data: bytes) -> str:
        """Part `number` (from 1); its ETag, which completing the upload names."""
        query = {"partNumber": str(number), "uploadId": upload_id}
        headers: dict[str, str] = {}
        self._request("PUT", bucket, key, query=query, body=data, response_headers=headers)
        return headers.get("etag", "")

    def complete_multipart_upload(self, bucket: str, key: str, upload_id: str, etags: list[str]) -> None:
        parts = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{tag}</ETag></Part>" for n, tag in enumerate(etags, 1)
        )
        body = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
        self._request("POST", bucket, key, query={"uploadId": upload_id}, body=body)

    def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        self._request("DELETE", bucket, key, query={"uploadId": upload_id})

    def multipart_uploads(self, bucket: str) -> list[str]:
        """The keys of the bucket's multipart uploads begun and neither completed nor aborted."""
        root = _xml(self._request("GET", bucket, query={"uploads": ""}), f"uploads of s3://{bucket}")
        return [upload.findtext(f"{_NAMESPACE}Key", "") for upload in root.iter(f"{_NAMESPACE}Upload")]

    def _request(
        self,
        method: str,
        bucket: str,
        key: str = "",
        query: Mapping[str, str] | None = None,
        body: bytes = b"",
        response_headers: dict[str, str] | None = None,
    ) -> bytes:
        path = "/" + _quote(bucket) + ("/" + _quote(key, safe="-_.~/") if key else "")
        query = dict(query or {})
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        digest = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
        headers = sign(method, self._host, path, query, {}, digest, self.credentials, self.region, amz_date)
        if body:
            headers["content-length"] = str(len(body))
        target = path + (
            "?" + "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items())) if query else ""
        )
        what = f"{method} s3://{bucket}/{key}"
        connection_type = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = connection_type(self._host, timeout=self.timeout)
        try:
            connection.request(method, target, body=body or None, headers=headers)
            response = connection.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as error:
            raise S3Unreachable(f"{what}: no answer from {self.endpoint}: {error}") from error
        finally:
            connection.close()
        if response_headers is not None:
            response_headers.update({k.lower(): v for k, v in response.getheaders()})
        if response.status >= 300:
            code, message = _error_of(payload, response.reason)
            raise S3Error(response.status, code, message, what)
        return payload


def _xml(payload: bytes, what: str) -> ElementTree.Element:
    try:
        return ElementTree.fromstring(payload)
    except ElementTree.ParseError as error:
        raise S3Error(200, "MalformedResponse", f"not S3's XML: {error}", what) from error


def _error_of(payload: bytes, reason: str) -> tuple[str, str]:
    """S3's error code and message from an error's XML body (a HEAD's has none: the HTTP reason)."""
    try:
        root = ElementTree.fromstring(payload) if payload else None
    except ElementTree.ParseError:
        root = None
    if root is None:
        return reason, ""
    return root.findtext("Code", reason), root.findtext("Message", "")
