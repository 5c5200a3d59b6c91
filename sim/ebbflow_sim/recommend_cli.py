"""`ebbflow-sim recommend`: measured steps and a price table in, the configuration to rent out.

Files (CSV with a header; docs/recommender.md):
- `--measurements`: gpu_type, workers, nodes, micro_batch, accumulation_steps, step_seconds,
  compute_seconds and optionally share (time-slicing) and virtual_nodes (V); one row per measured
  configuration, e.g. from the trainers' progress reports (`status.progress` has every field but
  gpu_type and nodes).
- `--prices`: gpu_type, price_per_gpu_hour and optionally gpus_per_node (8), max_gpus (64), speed
  (1.0: relative compute speed of a type with no measurement).

Bad files fail before anything is predicted, naming the file, row and column (exit 2).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ebbflow_operator.policies.throughput import Measurement

from .recommend import Goal, Offer, Option, choose, fit_model, held_out_errors, options

T = TypeVar("T")
MEASUREMENT_COLUMNS = (
    "gpu_type",
    "workers",
    "nodes",
    "micro_batch",
    "accumulation_steps",
    "step_seconds",
    "compute_seconds",
)
PRICE_COLUMNS = ("gpu_type", "price_per_gpu_hour")


class InputError(ValueError):
    """A file the recommender cannot use; the message names where and what to fix."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ebbflow-sim recommend",
        description="Fit a job's step-time model to its measurements and pick the cheapest "
        "configuration within a deadline, or the fastest within a budget.",
    )
    add = p.add_argument
    add("--measurements", type=Path, required=True, help="CSV of measured steps (see docs/recommender.md)")
    add("--prices", type=Path, required=True, help="CSV of GPU types and prices per GPU-hour")
    add("--steps", type=int, required=True, help="optimiser steps the job still has to train")
    add("--global-batch", type=int, required=True, help="B, samples per step")
    add("--virtual-nodes", type=int, required=True, help="V, the job's virtual nodes (its most workers)")
    goal = p.add_mutually_exclusive_group()
    goal.add_argument("--deadline-hours", type=float, help="the cheapest option finishing within this")
    goal.add_argument("--budget", type=float, help="the fastest option costing at most this")
    add("--json", action="store_true", help="one JSON object: the choice, the fit's error, every option")
    return p


@dataclass(frozen=True)
class _Row:
    """One CSV row and where it came from, for errors that name the file, line and column."""

    path: Path
    line: int
    values: dict[str, str]

    def get(self, column: str, kind: Callable[[str], T], default: T | None = None) -> T:
        text = (self.values.get(column) or "").strip()
        if not text and default is not None:
            return default
        try:
            return kind(text)
        except ValueError:
            raise self.error(f"{column}={text!r} is not a {getattr(kind, '__name__', kind)}") from None

    def error(self, message: str) -> InputError:
        return InputError(f"{self.path}, line {self.line}: {message}")


def _rows(path: Path, required: Sequence[str]) -> list[_Row]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise InputError(
                    f"{path}: missing column(s) {', '.join(missing)}; needs {', '.join(required)}"
                )
            return [_Row(path, line, values) for line, values in enumerate(reader, start=2)]
    except OSError as error:
        raise InputError(f"{path}: {error.strerror}") from None


def read_measurements(path: Path) -> list[Measurement]:
    measurements = []
    for row in _rows(path, MEASUREMENT_COLUMNS):
        measurement = Measurement(
            workers=row.get("workers", int),
            micro_batch=row.get("micro_batch", float),
            step_s=row.get("step_seconds", float),
            compute_s=row.get("compute_seconds", float),
            nodes=row.get("nodes", int),
            accum_steps=row.get("accumulation_steps", int),
            share=row.get("share", float, 1.0),
            gpu_type=row.values["gpu_type"].strip(),
            virtual_nodes=row.get("virtual_nodes", int, 0),
        )
        if measurement.workers < 1 or measurement.step_s <= 0 or measurement.compute_s <= 0:
            raise row.error("workers, step_seconds and compute_seconds must be > 0")
        measurements.append(measurement)
    if not measurements:
        raise InputError(f"{path}: no measurements; measure the job at a few sizes first")
    return measurements


def read_offers(path: Path) -> list[Offer]:
    offers = []
    for row in _rows(path, PRICE_COLUMNS):
        offer = Offer(
            gpu_type=row.values["gpu_type"].strip(),
            price_per_gpu_hour=row.get("price_per_gpu_hour", float),
            gpus_per_node=row.get("gpus_per_node", int, 8),
            max_gpus=row.get("max_gpus", int, 64),
            speed=row.get("speed", float, 1.0),
        )
        if offer.price_per_gpu_hour < 0 or offer.gpus_per_node < 1 or offer.max_gpus < 1 or offer.speed <= 0:
            raise row.error("needs price_per_gpu_hour >= 0, gpus_per_node >= 1, max_gpus >= 1, speed > 0")
        offers.append(offer)
    return offers


def _describe(option: Option | None) -> str:
    if option is None:
        return "no configuration meets the constraint"
    return (
        f"{option.workers} x {option.gpu_type} on {option.nodes} node(s): {option.step_s:.3f} s/step, "
        f"{option.hours:.2f} h, cost {option.cost:.2f}"
    )


def run(argv: Sequence[str] | None = None) -> dict[str, object]:
    p = parser()
    args = p.parse_args(argv)
    try:
        measured, offers = read_measurements(args.measurements), read_offers(args.prices)
    except InputError as error:
        p.error(str(error))
    goal = Goal(args.steps, args.global_batch, args.virtual_nodes, args.deadline_hours, args.budget)
    model = fit_model(measured)
    candidates = options(model, offers, goal)
    choice = choose(candidates, goal)
    errors = held_out_errors(measured)
    report: dict[str, object] = {
        "choice": None if choice is None else vars(choice),
        "median_held_out_error": statistics.median(errors) if errors else None,
        "speeds": model.speeds,
        "options": [vars(o) for o in candidates],
    }
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(f"choice: {_describe(choice)}")
        if errors:
            print(
                f"fit: median held-out error {statistics.median(errors):.1%} over {len(errors)} measurements"
            )
        else:
            print("fit: too few measurements of one type to hold any out")
        print(f"compute speed by type (reference {model.reference}): {model.speeds}")
    if choice is None:
        sys.exit(1)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    run(argv)
