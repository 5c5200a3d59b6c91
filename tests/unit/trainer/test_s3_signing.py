"""The S3 client's Signature Version 4, pure: AWS's published example (the S3 API reference,
"Signature calculations for the Authorization header", GET Object) and what a request signs."""

from __future__ import annotations

import pytest
from ebbflow_trainer.s3 import EMPTY_SHA256, Credentials, sign

EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
EXAMPLE_DATE = "20130524T000000Z"


def test_awss_get_object_example_gives_its_published_signature() -> None:
    headers = sign(
        "GET",
        "examplebucket.s3.amazonaws.com",
        "/test.txt",
        {},
        {"Range": "bytes=0-9"},
        EMPTY_SHA256,
        EXAMPLE,
        "us-east-1",
        EXAMPLE_DATE,
    )
    assert headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["x-amz-date"] == EXAMPLE_DATE and "host" not in headers  # http.client sends Host


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        pytest.param({"query": {"uploadId": "2"}}, True, id="query"),
        pytest.param({"payload": "0" * 64}, True, id="payload"),
        pytest.param({"host": "other:8333"}, True, id="host"),
        pytest.param({"credentials": Credentials("AKIAIOSFODNN7EXAMPLE", "other")}, True, id="secret"),
        pytest.param({}, False, id="same-request"),
    ],
)
def test_the_signature_covers_the_query_the_payload_the_host_and_the_secret(
    change: dict[str, object], differs: bool
) -> None:
    def signature(query: dict[str, str], payload: str, host: str, credentials: Credentials) -> str:
        signed = sign("PUT", host, "/b/k", query, {}, payload, credentials, "us-east-1", EXAMPLE_DATE)
        return signed["authorization"].rsplit("=", 1)[1]

    base = {"query": {"uploadId": "1"}, "payload": EMPTY_SHA256, "host": "s3:8333", "credentials": EXAMPLE}
    assert (signature(**base) != signature(**(base | change))) == differs  # type: ignore[arg-type]


def test_a_session_token_is_sent_and_signed() -> None:
    temporary = Credentials("AK", "SK", "token")
    headers = sign("GET", "s3", "/b", {}, {}, EMPTY_SHA256, temporary, "us-east-1", EXAMPLE_DATE)
    assert headers["x-amz-security-token"] == "token"
    assert "x-amz-security-token" in headers["authorization"].split("SignedHeaders=")[1]


def test_credentials_come_from_the_standard_variables() -> None:
    env = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"}
    assert Credentials.from_env(env) == Credentials("AK", "SK")
    assert Credentials.from_env({"AWS_ACCESS_KEY_ID": "AK"}) is None
