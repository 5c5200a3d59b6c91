"""kopf's settings as the operator sets them: how long it keeps retrying an API server that fails."""

from __future__ import annotations

import itertools
from collections.abc import Sized

import pytest
from ebbflow_operator.handlers import RetryForever

pytestmark = pytest.mark.unit


def test_requests_are_retried_for_as_long_as_the_api_server_fails_every_5_s_at_most() -> None:
    backoffs = RetryForever()
    assert not isinstance(backoffs, Sized)  # kopf counts a last attempt only for a sized sequence
    first = list(itertools.islice(backoffs, 10_000))
    assert first[:5] == [1, 1, 2, 3, 5] and max(first) == 5 and len(first) == 10_000


def test_each_request_starts_its_backoffs_from_the_beginning() -> None:
    backoffs = RetryForever()
    list(itertools.islice(backoffs, 7))
    assert list(itertools.islice(backoffs, 2)) == [1, 1]
