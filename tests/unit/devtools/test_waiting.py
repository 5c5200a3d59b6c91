"""`wait_for`: what it returns, when it gives up, and what its timeout says about the last poll."""

from __future__ import annotations

import pytest
from ebbflow_devtools.waiting import NotYet, wait_for

pytestmark = pytest.mark.unit


def test_the_first_truthy_value_is_returned_and_a_not_yet_polls_again() -> None:
    answers = iter([None, NotYet("one worker left to switch"), 0, "done"])
    assert wait_for(lambda: next(answers), 5, "the answer", interval=0) == "done"


@pytest.mark.parametrize(
    ("last", "shown"),
    [
        pytest.param(None, "last value: None)", id="a-bare-none-says-only-that"),
        pytest.param(
            NotYet("chosen 96; worker-1 at 24"),
            "last value: chosen 96; worker-1 at 24)",
            id="not-yet-says-why",
        ),
        pytest.param(NotYet("x" * 1000), "last value: " + "x" * 1000 + ")", id="a-reason-is-not-cut-at-300"),
    ],
)
def test_a_timeout_names_what_was_awaited_and_the_last_value(last: object, shown: str) -> None:
    with pytest.raises(TimeoutError) as raised:
        wait_for(lambda: last, 0, "the batch on every worker", interval=0)
    assert str(raised.value).startswith("timed out after 0s waiting for the batch on every worker (")
    assert str(raised.value).endswith(shown)


def test_an_assertion_in_the_condition_gives_up_at_once() -> None:
    def dead() -> None:
        raise AssertionError("the process exited")

    with pytest.raises(AssertionError, match="the process exited"):
        wait_for(dead, 60, "a process that died")
