"""The tiny causal LM example trained sharded and elastic (issue 46, item 5), against a calm run.

``examples/tiny_lm/train.py:build_sharded`` (FSDP2, each transformer block its own unit, AdamW, fast
mode, V = 12 virtual nodes, B = 48, 400 steps, buddy copies every step) is trained twice with the
trainer's launchers on this machine (gloo, CPU): calmly by two workers, and by workers that come and
go: two start, a third joins, one leaves gracefully (SIGTERM), one is killed (SIGKILL), and the last
one trains to the end. Reported: each world (size, first step, where its state came from, steps
lost), the final training loss of both runs and their relative parameter difference, and each
worker's bytes of parameters and AdamW state at N = 1, 2, 3 (FSDP2's ``torch.chunk`` layout: the
largest rank), against a whole replica's.

    .venv/bin/python bench/sharded_lm_elastic.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from ebbflow_devtools.testing.trainer_cluster import Node, parameters_of, running_job
from ebbflow_trainer.api import load_spec
from ebbflow_trainer.launch.buddies import rows

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = f"{ROOT / 'examples' / 'tiny_lm' / 'train.py'}:build_sharded"
SETTINGS: dict[str, Any] = {
    "mode": "fast",
    "script": SCRIPT,
    "virtual_nodes": 12,
    "global_batch_size": 48,
    "steps": 400,
    # Each virtual node's pass takes at least 20 ms, so the world trains on while a launcher starts.
    "extra_args": ["--simulated-vnode-seconds", "0.02"],
}


def _calm(root: Path) -> tuple[dict[str, Any], float]:
    with running_job(root, min_replicas=2, max_replicas=2, **SETTINGS) as job:
        nodes = [job.start_node() for _ in range(2)]
        assert job.wait_all(nodes, 600) == [0, 0], job.logs()
        return job.final_checkpoint(), _last_loss(nodes)


def _elastic(root: Path) -> tuple[dict[str, Any], float, list[tuple[int, int, int, str, int]]]:
    with running_job(root, min_replicas=1, max_replicas=3, **SETTINGS) as job:
        nodes = [job.start_node() for _ in range(2)]
        job.wait_for_world(nodes[0], 2, min_step=40)
        nodes.append(job.start_node())
        job.wait_for_world(nodes[2], 3, min_step=100)
        leaver = _rank(nodes, 3, 1)
        leaver.terminate()
        stayers = [n for n in nodes if n is not leaver]
        job.wait_for_world(stayers[0], 2, min_step=170)
        victim = _rank(stayers, 2, 1)
        victim.kill_tree()
        (last,) = [n for n in stayers if n is not victim]
        assert job.wait_all([last], 600) == [0], job.logs()
        worlds = sorted(
            {
                (g["generation"], g["world"], g["step"], g["source"], g.get("steps_lost", 0))
                for n in nodes
                for g in n.events("generation")
                if g["rank"] == 0
            }
        )
        return job.final_checkpoint(), _last_loss(nodes), worlds


def _rank(nodes: list[Node], world: int, rank: int) -> Node:
    return next(
        n for n in nodes if (n.last_step() or {}).get("world") == world and n.last_step()["rank"] == rank
    )


def _last_loss(nodes: list[Node]) -> float:
    finals = [r for n in nodes for r in n.events("step") if r["rank"] == 0]
    return float(max(finals, key=lambda r: (r["step"], r["generation"]))["loss"])


def _state_bytes_per_worker(workers: int) -> int:
    """The largest rank's parameters plus AdamW's two moments, in FSDP2's layout over ``workers``."""
    total = 0
    for param in load_spec(SCRIPT).model.parameters():
        start, stop = rows(param.shape[0], workers, 0)
        total += (stop - start) * (param.numel() // param.shape[0]) * param.element_size() * 3
    return total


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-lm-") as root:
        (Path(root) / "calm").mkdir()
        (Path(root) / "elastic").mkdir()
        calm, calm_loss = _calm(Path(root) / "calm")
        elastic, elastic_loss, worlds = _elastic(Path(root) / "elastic")
    ours, theirs = parameters_of(elastic), parameters_of(calm)
    flat_ours = torch.cat([ours[k].flatten() for k in sorted(ours)])
    flat_theirs = torch.cat([theirs[k].flatten() for k in sorted(theirs)])
    report = {
        "worlds (generation, size, step, source, steps lost)": worlds,
        "final loss calm / elastic": [round(calm_loss, 4), round(elastic_loss, 4)],
        "relative parameter difference": float((flat_ours - flat_theirs).norm() / flat_theirs.norm()),
        "state KiB per worker at N = 1, 2, 3": [
            round(_state_bytes_per_worker(n) / 1024, 1) for n in (1, 2, 3)
        ],
        "final step": elastic["step"],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
