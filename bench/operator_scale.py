"""The operator benchmark at several scales, and how each figure grows with the scale.

    .venv/bin/python bench/operator_scale.py [--scales 100x500,300x1500,1000x5000] [--deletions 20]
                                            [--plot docs/operator_scale.png]

Each scale JOBSxNODES is one run of bench/operator_bench.py in its own process (its own control
plane): JOBS steady jobs (min 2, max 24) on NODES KWOK nodes of 4 GPUs, --deletions node losses one
at a time, then 5 x JOBS jobs (min 1, max 4) submitted at once, as the 100 x 500 default. Results go
to bench/results/operator-JOBSxNODES.json; a summary with the fitted growth of each figure to
bench/results/operator_scale.json and the plot.

The growth is the slope of log(figure) against log(nodes + pods) between the scales (least squares):
about 1 is linear, 2 quadratic; n log n reads a little above 1 over a decade.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
BURST_PER_JOB = 5  # the default run: 100 steady jobs, 500 in the burst
# (label, how to read it from one run's results); every figure a cost that grows with the scale.
FIGURES: tuple[tuple[str, str], ...] = (
    ("deletion → resize p50 (s)", "deletion_latency_p50_s"),
    ("deletion → resize p95 (s)", "deletion_latency_p95_s"),
    ("steady jobs converge (s)", "converge_jobs_s"),
    ("burst converges (s)", "converge_burst_s"),
    ("decide per pass, mean (s)", "decide_per_pass.mean_s"),
    ("operator peak RSS (MB)", "operator_peak_rss_mb"),
    ("operator CPU (s)", "operator_cpu_s"),
)


def read(results: dict[str, Any], path: str) -> float:
    value: Any = results
    for part in path.split("."):
        value = value[part]
    return float(value)


def objects(results: dict[str, Any]) -> int:
    """Nodes plus the pods of the burst at its end (workers and one rendezvous pod per job)."""
    workers = min(4 * results["burst"], (results["nodes"] - results["deletions"]) * 4)
    return int(results["nodes"] + workers + results["burst"])


def growth(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def run(jobs: int, nodes: int, deletions: int) -> dict[str, Any]:
    out = RESULTS / f"operator-{jobs}x{nodes}.json"
    command = [sys.executable, str(REPO / "bench" / "operator_bench.py"), "--jobs", str(jobs)]
    command += ["--nodes", str(nodes), "--burst", str(BURST_PER_JOB * jobs), "--deletions", str(deletions)]
    subprocess.run([*command, "--output", str(out)], check=True)
    results: dict[str, Any] = json.loads(out.read_text())
    return results


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    sizes = [objects(r) for r in runs]
    table = {label: [read(r, path) for r in runs] for label, path in FIGURES}
    slopes = (
        {label: round(growth(sizes, values), 2) for label, values in table.items()} if len(runs) > 1 else {}
    )
    return {
        "scales": [f"{r['jobs']}x{r['nodes']}" for r in runs],
        "objects": sizes,
        "figures": table,
        "growth": slopes,
    }


def plot(found: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = found["figures"]
    rows = math.ceil(len(figures) / 4)
    fig, grid = plt.subplots(rows, 4, figsize=(12.8, 3.2 * rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(figures) :]:
        ax.axis("off")
    for ax, (label, values) in zip(axes, figures.items(), strict=False):
        ax.loglog(found["objects"], values, "o-")
        slope = found["growth"].get(label)
        ax.set_title(f"{label}\ngrowth {slope}" if slope is not None else label, fontsize=8)
        ax.set_xlabel("nodes + pods", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scales", default="100x500,300x1500,1000x5000")
    parser.add_argument("--deletions", type=int, default=20)
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "operator_scale.png")
    parser.add_argument("--reuse", action="store_true", help="read the runs already in bench/results")
    args = parser.parse_args()
    runs = []
    for scale in args.scales.split(","):
        jobs, nodes = (int(part) for part in scale.split("x"))
        out = RESULTS / f"operator-{jobs}x{nodes}.json"
        reused = args.reuse and out.exists()
        runs.append(json.loads(out.read_text()) if reused else run(jobs, nodes, args.deletions))
    found = summary(runs)
    (RESULTS / "operator_scale.json").write_text(json.dumps(found, indent=2))
    print("| figure | " + " | ".join(found["scales"]) + " | growth |")
    print("|---|" + "---:|" * (len(runs) + 1))
    for label, values in found["figures"].items():
        print(
            f"| {label} | " + " | ".join(f"{v:g}" for v in values) + f" | {found['growth'].get(label, '-')} |"
        )
    plot(found, args.plot)


if __name__ == "__main__":
    main()
