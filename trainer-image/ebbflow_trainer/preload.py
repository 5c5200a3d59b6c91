"""Imported once by the launcher's forkserver, so every world's worker is forked warm.

A fresh worker process would spend seconds importing torch and the training script on every
membership change; forked from a process that already has, it starts in milliseconds. The training
script's module is executed here (its imports are what is slow) but ``build()`` runs in each worker.
"""

from __future__ import annotations

import os

import torch
import torch.distributed

import ebbflow_trainer.worker  # noqa: F401 - imported for its import cost
from ebbflow_trainer.api import import_script

# The launcher names the training script here before the forkserver starts.
ENV_PRELOAD_SCRIPT = "EBBFLOW_TRAINER_PRELOAD_SCRIPT"

torch.set_num_threads(1)
if os.environ.get(ENV_PRELOAD_SCRIPT):
    import_script(os.environ[ENV_PRELOAD_SCRIPT])
