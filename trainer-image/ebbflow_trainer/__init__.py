"""Ebbflow trainer: elastic, virtual-node PyTorch training inside worker pods.

Importing the package stays light (no torch) so the operator can use :mod:`ebbflow_trainer.contract`;
training scripts import :class:`TrainingSpec` from here, which loads torch on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ebbflow_trainer.api import TrainingSpec

__all__ = ["TrainingSpec"]


def __getattr__(name: str) -> Any:
    if name == "TrainingSpec":
        from ebbflow_trainer.api import TrainingSpec

        return TrainingSpec
    raise AttributeError(name)
