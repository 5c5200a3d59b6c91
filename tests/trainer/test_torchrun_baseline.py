"""The stock-torchrun baseline (examples/digits/torchrun_ddp.py, what Kubeflow's PyTorchJob runs in
bench comparisons) trains, and a restart resumes from its checkpoint, not from step 0: real torchrun,
two processes, gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "digits" / "torchrun_ddp.py"


def torchrun(checkpoints: Path, steps: int, *extra: str) -> list[dict[str, Any]]:
    """One torchrun of the baseline on two local processes; its JSON events on stdout."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=2",
    ]
    command += [
        str(SCRIPT),
        "--checkpoint-dir",
        str(checkpoints),
        "--steps",
        str(steps),
        "--checkpoint-every",
        "20",
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_the_torchrun_baseline_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    first = torchrun(tmp_path, steps=30)
    assert [e["step"] for e in first if e["event"] == "start"] == [0]
    assert [e["step"] for e in first if e["event"] == "step"] == list(range(1, 31))

    # A restart finds the checkpoint of step 30 (the last step is always saved) and goes on from there.
    journal = tmp_path / "events.jsonl"
    second = torchrun(tmp_path, 100, "--events", str(journal))
    assert [e["step"] for e in second if e["event"] == "start"] == [30]
    assert [e["step"] for e in second if e["event"] == "step"] == list(range(31, 101))
    (done,) = [e for e in second if e["event"] == "done"]
    assert done["world"] == 2 and done["accuracy"] >= 0.95
    # --events: the same lines in a file that outlives the process (a pod's shared volume).
    assert [json.loads(line) for line in journal.read_text().splitlines()] == second
