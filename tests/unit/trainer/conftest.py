"""Trainer maths in one process runs with one intra-op thread, as every worker does (``run_worker``):
the results do not depend on it, and on a small machine torch's default thread pool made these
tests an order of magnitude slower."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
