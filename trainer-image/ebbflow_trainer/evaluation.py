"""The training script's evaluation hook: when it runs, how, and the last result (part of the state).

``eval_fn(model)`` runs after every ``eval_every``-th step and after the last step, on every worker:
rank 0 alone would leave the others waiting in the next all-reduce for as long (and past the
collective timeout if evaluation is slow), and every worker evaluating keeps state the script
updates from its metrics (``extra_state``) the same on every worker. It runs in ``model.eval()``,
under ``torch.no_grad()`` and the step's autocast precision, and torch's RNG state is restored
afterwards, so evaluating never changes training. A step is evaluated at most once: a world that
re-forms after the evaluation does not repeat it; one that re-forms before it (a worker died while
the others evaluated) may lose that step's metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch

from ebbflow_trainer.api import SpecError, TrainingSpec


class Evaluation:
    def __init__(self, spec: TrainingSpec, autocast: Callable[[], AbstractContextManager[Any]]):
        self.spec = spec
        self.autocast = autocast
        self.last: dict[str, Any] | None = None  # {"step": s, "metrics": {name: value}}

    def due(self, step: int, total_steps: int) -> bool:
        """Whether the state after ``step`` completed steps is to be evaluated."""
        spec = self.spec
        if spec.eval_fn is None or (self.last is not None and self.last["step"] == step):
            return False
        return step == total_steps or (spec.eval_every is not None and step % spec.eval_every == 0)

    def run(self, step: int) -> dict[str, float]:
        """Evaluate the model as it is after ``step`` steps; the metrics, also kept in ``last``."""
        model, eval_fn = self.spec.model, self.spec.eval_fn
        assert eval_fn is not None
        was_training = model.training
        devices = [torch.cuda.current_device()] if _on_cuda(model) else []
        with torch.random.fork_rng(devices=devices), torch.no_grad(), self.autocast():
            model.eval()
            try:
                raw = eval_fn(model)
            finally:
                model.train(was_training)
        metrics = _as_metrics(raw)
        self.last = {"step": step, "metrics": metrics}
        return metrics

    def report(self) -> dict[str, Any] | None:
        """The last evaluation for the progress report: JSON has no NaN, so non-finite values are left out."""
        if self.last is None:
            return None
        finite = {name: value for name, value in self.last["metrics"].items() if math.isfinite(value)}
        return {"step": self.last["step"], "metrics": finite}


def _on_cuda(model: torch.nn.Module) -> bool:
    return any(p.device.type == "cuda" for p in model.parameters())


def _as_metrics(raw: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise SpecError(
            f"TrainingSpec.eval_fn returned {type(raw).__name__}: return a dict of metric name -> number."
        )
    metrics: dict[str, float] = {}
    for name, value in raw.items():
        try:
            metrics[str(name)] = float(value)
        except (TypeError, ValueError):
            raise SpecError(
                f"TrainingSpec.eval_fn returned {name!r}: {value!r}: every metric must be a number "
                "(or a one-element tensor)."
            ) from None
    return metrics
