"""The rendezvous module's stand-in for torch's `dynamic_rendezvous.get_method_name`: the same names
as the `inspect.stack()` original at every depth above itself, installed where torch's rendezvous
loop looks it up."""

from __future__ import annotations

import inspect

import pytest
from ebbflow_trainer.launch import rendezvous
from torch.distributed.elastic.rendezvous import dynamic_rendezvous


def _original(depth: int) -> str:
    """torch's implementation (called from where it is: frame 0 is itself, 1 its caller)."""
    stack = inspect.stack()
    return stack[depth].function if len(stack) > depth else "no_method_name"


def _record(depth: int) -> tuple[str, str]:
    """Plays torch's `_record`: asks both who called it."""
    return rendezvous.method_name(depth), _original(depth)


def run_step(depth: int) -> tuple[str, str]:
    """Plays torch's executor `run`, the caller whose name `_record` wants."""
    return _record(depth)


@pytest.mark.parametrize("depth", [pytest.param(d, id=f"depth-{d}") for d in (1, 2, 3)])
def test_same_names_as_torch(depth: int) -> None:
    ours, torchs = run_step(depth)
    assert ours == torchs
    assert depth != 2 or ours == "run_step"


def test_beyond_the_stack_gives_torchs_placeholder() -> None:
    assert rendezvous.method_name(10_000) == "no_method_name"


def test_installed_where_torch_looks_it_up() -> None:
    assert dynamic_rendezvous.get_method_name is rendezvous.method_name
