"""Imported once by the launcher's forkserver, so every world's worker is forked warm.

A fresh worker process would spend seconds importing torch and the training script on every
membership change; forked from a process that already has, it starts in milliseconds. ``build()`` runs
once here and its result is dropped: the first model and optimizer construction pulls in lazily
imported parts of torch (seconds on a busy node). Each worker builds its own spec after the fork, so
``build()`` must not start threads or processes (forking a process with threads is unsafe).
"""

from __future__ import annotations

import os

import torch
import torch.distributed

import ebbflow_trainer.launch.worker  # noqa: F401 - imported for its import cost
from ebbflow_trainer.api import load_spec

# The launcher names the training script here before the forkserver starts.
ENV_PRELOAD_SCRIPT = "EBBFLOW_TRAINER_PRELOAD_SCRIPT"

torch.set_num_threads(1)
if os.environ.get(ENV_PRELOAD_SCRIPT):
    load_spec(os.environ[ENV_PRELOAD_SCRIPT])
