"""`wait_for`: poll a condition until it holds, for the dev cluster, the benchmarks and every test tier.

Standard library only, so that waiting for something never needs more than it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")

_SHOWN = 300  # characters of the last value shown in a timeout message
_SHOWN_REASON = 3000  # characters of a NotYet's reason: it was written to be read


class NotYet:
    """A condition's "not yet" that says why: falsy, so `wait_for` polls again, and its reason is
    what a timeout reports as the last value (a bare None says nothing about which part was missing)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return self.reason


def wait_for(
    condition: Callable[[], T | NotYet | None], timeout: float, what: str, interval: float = 0.1
) -> T:
    """Poll `condition` every `interval` seconds until it returns something truthy, and return that.

    An exception from `condition` counts as "not yet" (an API server restarting, a file caught
    half-written) and is polled again, except AssertionError: a condition asserts to give up at once
    (the process it waits on has died). After `timeout` seconds, raises TimeoutError naming `what`
    and the last value or exception (chained as its cause).
    """
    deadline = time.monotonic() + timeout
    while True:
        error: Exception | None = None
        try:
            result = condition()
        except AssertionError:
            raise
        except Exception as caught:
            error = caught
        else:
            if result:
                return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if error is not None:
                last = f"last error: {error!r}"
            else:
                shown, limit = repr(result), _SHOWN_REASON if isinstance(result, NotYet) else _SHOWN
                last = f"last value: {shown if len(shown) <= limit else shown[:limit] + '...'}"
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} ({last})") from error
        time.sleep(min(interval, remaining))
