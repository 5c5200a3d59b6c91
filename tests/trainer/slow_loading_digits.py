"""The digits example behind a slow load, as a script that fetches its data at import would be: the
import writes ``LOADING_MARKER`` (a path from the environment) and then waits, up to a minute, for
``LOADED_MARKER`` to exist before building the spec. A test sends SIGTERM while the launcher loads it
(its check of the script, before it joins the job's rendezvous).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ebbflow_trainer import TrainingSpec
from ebbflow_trainer.api import load_spec

DIGITS = str(Path(__file__).resolve().parents[2] / "examples" / "digits" / "train.py")
LOAD_LIMIT_S = 60.0

Path(os.environ["LOADING_MARKER"]).touch()
_deadline = time.monotonic() + LOAD_LIMIT_S
while not Path(os.environ["LOADED_MARKER"]).exists() and time.monotonic() < _deadline:
    time.sleep(0.05)


def build() -> TrainingSpec:
    return load_spec(DIGITS)
