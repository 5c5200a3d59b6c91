"""Where object-store checkpoints go, pure: `s3://bucket/prefix` parsed, keys laid out, bad URIs
refused with what is wrong (launch/object_checkpoints.py)."""

from __future__ import annotations

import pytest
from ebbflow_trainer.launch.object_checkpoints import Location


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix", "key"),
    [
        pytest.param("s3://ckpt", "ckpt", "", "step-000000000050/state.pt", id="bucket-only"),
        pytest.param("s3://ckpt/", "ckpt", "", "step-000000000050/state.pt", id="trailing-slash"),
        pytest.param("s3://ckpt/jobs/a", "ckpt", "jobs/a/", "jobs/a/step-000000000050/state.pt", id="prefix"),
        pytest.param(
            "s3://my.bucket-1/a//", "my.bucket-1", "a/", "a/step-000000000050/state.pt", id="slashes"
        ),
    ],
)
def test_a_location_lays_out_its_keys(uri: str, bucket: str, prefix: str, key: str) -> None:
    location = Location.parse(uri)
    assert (location.bucket, location.prefix, location.key(50, "state.pt")) == (bucket, prefix, key)


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        pytest.param("/checkpoints", "not an s3:// URI", id="a-path"),
        pytest.param("s3://", "is not a bucket name", id="no-bucket"),
        pytest.param("s3://UPPER/x", "is not a bucket name", id="upper-case"),
        pytest.param("s3://ab/x", "is not a bucket name", id="too-short"),
    ],
)
def test_a_bad_uri_is_refused_saying_why(uri: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Location.parse(uri)
