"""Ebbflow trainer: elastic, virtual-node PyTorch training inside worker pods.

Importing the package stays light (no torch) so the operator can use :mod:`ebbflow_trainer.contract`;
training scripts import :class:`TrainingSpec` (and :class:`LossScaling`) from here, which loads torch
on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ebbflow_trainer.api import LossScaling, TrainingSpec

__all__ = ["LossScaling", "TrainingSpec"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ebbflow_trainer import api

        return getattr(api, name)
    raise AttributeError(name)
