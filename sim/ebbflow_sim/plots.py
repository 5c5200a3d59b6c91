"""`--plot DIR`: each policy's JCTs and utilisation series as CSV, and PNGs when matplotlib is there.

matplotlib is optional (not an operator dependency): the CSVs are always written, so the figures
can be drawn elsewhere; its absence is reported on stderr, not an error.
"""

from __future__ import annotations

import csv
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .simulation import Result


def write_series(results: Sequence[Result], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for result in results:
        with (folder / f"jct_{result.policy}.csv").open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["jct_s"])
            writer.writerows([j] for j in sorted(result.jct_s))
        with (folder / f"utilization_{result.policy}.csv").open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["time_s", "utilization"])
            writer.writerows(result.utilization)


def write_plots(results: Sequence[Result], folder: Path) -> None:
    write_series(results, folder)
    try:
        pyplot: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        print(f"--plot: matplotlib is not installed; wrote only the CSV series to {folder}", file=sys.stderr)
        return
    fig, ax = pyplot.subplots()
    for result in results:
        jct = sorted(result.jct_s)
        ax.plot(jct, [(i + 1) / len(jct) for i in range(len(jct))], label=result.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.legend()
    fig.savefig(folder / "jct_cdf.png", dpi=120)
    fig, ax = pyplot.subplots()
    for result in results:
        ax.step([t for t, _ in result.utilization], [u for _, u in result.utilization], label=result.policy)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("GPU utilisation")
    ax.legend()
    fig.savefig(folder / "utilization.png", dpi=120)
