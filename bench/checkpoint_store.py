"""What durable checkpoints cost the training: step time with asynchronous object-store checkpoints
(a local SeaweedFS, `docs/trainer.md`, "Checkpoints in object storage") against none and against
today's synchronous file checkpoint, at two state sizes, in one run; and the uploads' throughput.

One worker (V=4, B=32, the digits example with a state padded to `--sizes` MiB by
`tests/trainer/ballast_digits.py`), `--steps` steps, a checkpoint every `--interval` steps. Per run:
the median step time, the mean of the steps that pay for a checkpoint (the one after it was taken)
and of the steps after those, and the whole run's wall time (each from the node's journal), then
the ratio of each to the run without checkpoints. Object store: the committed uploads' bytes per
second. Sides alternate, `--repeats` times.

    .venv/bin/python bench/checkpoint_store.py [--sizes 16 128] [--repeats 3] [--output FILE]

Needs `make tools` (SeaweedFS's `weed`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from ebbflow_api import contract
from ebbflow_devtools.testing import seaweedfs
from ebbflow_devtools.testing.trainer_cluster import running_job

SCRIPT = str(Path(__file__).resolve().parents[1] / "tests" / "trainer" / "ballast_digits.py")
SIDES = ("none", "file", "object-store")
METRICS = ("median_step_s", "checkpoint_step_mean_s", "following_step_mean_s", "wall_s", "upload_mb_per_s")


def run_once(
    root: Path, side: str, size_mb: int, steps: int, interval: int, store: seaweedfs.SeaweedFS
) -> dict[str, Any]:
    root.mkdir(parents=True)
    with running_job(root, min_replicas=1, max_replicas=1, script=SCRIPT, steps=steps) as job:
        env = {"BALLAST_MB": str(size_mb), contract.ENV_CHECKPOINT_INTERVAL_STEPS: str(interval)}
        if side == "none":
            env[contract.ENV_CHECKPOINT_PATH] = ""
        elif side == "object-store":
            bucket = f"bench-{root.name}"
            store.create_bucket(bucket)
            env |= {
                contract.ENV_CHECKPOINT_PATH: f"s3://{bucket}/run",
                contract.ENV_CHECKPOINT_ENDPOINT: store.endpoint,
                "AWS_ACCESS_KEY_ID": seaweedfs.ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": seaweedfs.SECRET_KEY,
            }
        node = job.start_node(env=job.environment(**env))
        assert job.wait_all([node], 900) == [0], job.logs()
    step_events = node.events("step")
    times = [e["time"] for e in step_events]
    gaps = {
        e["step"]: later - earlier
        for e, earlier, later in zip(step_events[1:], times, times[1:], strict=False)
    }
    # A checkpoint is taken after step s's event: its cost is in step s + 1's gap, and work it left
    # running beside the training (a serialization, an upload) slows step s + 2.
    paying = [gaps[s] for s in gaps if s % interval == 1 and s < steps]
    following = [gaps[s] for s in gaps if s % interval == 2 and s < steps]
    uploads = node.events("checkpoint-committed")
    return {
        "median_step_s": statistics.median(gaps.values()),
        "checkpoint_step_mean_s": statistics.mean(paying) if paying else None,
        "following_step_mean_s": statistics.mean(following) if following else None,
        "wall_s": times[-1] - times[0],
        "upload_mb_per_s": statistics.median(e["bytes"] / e["seconds"] / 2**20 for e in uploads)
        if uploads
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 128], help="state sizes (MiB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--interval", type=int, default=20)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ebbflow-bench-ckpt-") as scratch:
        store = seaweedfs.start(Path(scratch) / "store")
        try:
            runs: dict[str, list[dict[str, Any]]] = {}
            for size in args.sizes:
                for repeat in range(args.repeats):
                    for side in SIDES:
                        root = Path(scratch) / f"{side}-{size}-{repeat}"
                        found = run_once(root, side, size, args.steps, args.interval, store)
                        print(json.dumps({"size_mb": size, "side": side, **found}), flush=True)
                        runs.setdefault(f"{size}/{side}", []).append(found)
        finally:
            store.stop()
    summary = summarize(runs, args.sizes)
    print(json.dumps(summary, indent=2))
    if args.output:
        args.output.write_text(json.dumps({"runs": runs, "summary": summary}, indent=2) + "\n")


def summarize(runs: dict[str, list[dict[str, Any]]], sizes: list[int]) -> dict[str, Any]:
    """Medians per size and side, and each side's ratio to the run without checkpoints."""
    summary: dict[str, Any] = {}
    for size in sizes:
        base = runs[f"{size}/none"]
        for side in SIDES:
            measured = runs[f"{size}/{side}"]
            row: dict[str, Any] = {}
            for metric in METRICS:
                values = [r[metric] for r in measured if r[metric] is not None]
                row[metric] = statistics.median(values) if values else None
            for metric in ("checkpoint_step_mean_s", "following_step_mean_s", "wall_s"):
                reference = statistics.median(r[metric] for r in base if r[metric] is not None)
                row[f"{metric}_over_none"] = row[metric] / reference if row[metric] else None
            summary[f"{size} MiB, {side}"] = row
    return summary


if __name__ == "__main__":
    main()
