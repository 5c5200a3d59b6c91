"""Reading the trainers' world lines back: the formats the trainer logs (rendered here from its own
format strings, declared in `ebbflow_api.contract`) are what `ebbflow_devtools.trainer_logs` parses."""

from __future__ import annotations

import pytest
from ebbflow_api.contract import (
    BATCH_LOG,
    COMMITTED_LOG,
    FINISHED_LOG,
    RATE_LOG,
    RESUMED_LOG,
    RESUMES_LOG,
)
from ebbflow_devtools.trainer_logs import (
    BatchSwitch,
    RateSwitch,
    Resumption,
    World,
    batch_switches,
    committed_checkpoints,
    finished,
    rate_switches,
    resumptions,
    worlds,
)


def resumes(generation: int, rank: int, size: int, step: int, source: str, lost: int | None) -> str:
    return RESUMES_LOG % (
        generation,
        rank,
        size,
        step,
        source,
        f", {lost} step(s) lost" if lost is not None else "",
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(resumes(1, 0, 2, 0, "fresh", 0), Resumption(1, 0, 2, 0, "fresh", 0), id="rank0-fresh"),
        pytest.param(
            resumes(4, 1, 3, 812, "peer", None), Resumption(4, 1, 3, 812, "peer", None), id="rank1-peer"
        ),
        pytest.param(
            resumes(12, 0, 1, 90, "memory", 3), Resumption(12, 0, 1, 90, "memory", 3), id="lost-steps"
        ),
    ],
)
def test_a_resume_line_is_read_back(line: str, expected: Resumption) -> None:
    assert resumptions(f"2026-11-22 INFO ebbflow_trainer.launch.worker: {line}\nother text\n") == [expected]


def test_worlds_come_from_rank_zero_across_overlapping_logs_with_their_pauses() -> None:
    first = "\n".join([resumes(1, 0, 3, 0, "fresh", 0), resumes(2, 1, 2, 40, "memory", None)])
    second = "\n".join(
        [resumes(1, 1, 3, 0, "fresh", None), resumes(2, 0, 2, 40, "memory", 0), RESUMED_LOG % (2, 1.234)]
    )
    assert worlds([first, second, second]) == [
        World(1, 3, 0, "fresh", 0, None),
        World(2, 2, 40, "memory", 0, 1.23),
    ]


def test_the_final_digest_is_read_from_whichever_log_has_it() -> None:
    digest = "ab" * 32
    assert finished(["no end here", f"INFO {FINISHED_LOG % (900, digest)}"]) == (900, digest)
    assert finished(["still training"]) is None


def test_batch_and_rate_switches_are_read_back_in_order() -> None:
    log = "\n".join(
        [
            f"INFO {BATCH_LOG % (120, 512, 256, 32)}",
            "a step",
            f"INFO {RATE_LOG % (130, 0.5, 0.0)}",
            f"INFO {BATCH_LOG % (300, 256, 512, 16)}",
            f"INFO {RATE_LOG % (310, 0.25, 0.5)}",
        ]
    )
    assert batch_switches(log) == [BatchSwitch(120, 512, 256, 32), BatchSwitch(300, 256, 512, 16)]
    assert rate_switches(log) == [RateSwitch(130, 0.5, 0.0), RateSwitch(310, 0.25, 0.5)]


def test_committed_checkpoints_are_read_back_in_order() -> None:
    log = "\n".join(
        [
            f"INFO {COMMITTED_LOG % (50, 's3://checkpoints/digits', 0.42)}",
            "WARNING checkpoint of step 100 not uploaded (training goes on): HTTP 503",
            f"INFO {COMMITTED_LOG % (150, 's3://checkpoints/digits', 1.5)}",
        ]
    )
    assert committed_checkpoints(log) == [50, 150]
