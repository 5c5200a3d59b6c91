"""CPU trainer image only: torch says it was built without CUDA, as a CPU-only torch wheel does.

The CPU image carries the PyPI (CUDA) torch with libtorch_cuda.so and the CUDA libraries replaced by
stubs (trainer-image/cpu/cuda_stubs.py), so no CUDA kernel is registered. Python code that asks
`torch.backends.cuda.is_built()` (torch._C._has_cuda) before registering CUDA overrides must hear
"no". A `.pth` file imports this module at interpreter start; it sets the flag right after torch._C
is loaded, in every process (training scripts included), and only where EBBFLOW_TORCH_VARIANT=cpu
(the CUDA image, built on top of the CPU one, sets it to cuda and keeps torch untouched).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any


class _ExtensionWithoutCuda(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module._has_cuda = False  # type: ignore[attr-defined]


class _TorchWithoutCuda(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch._C":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _ExtensionWithoutCuda(spec.loader)
        return spec


if os.environ.get("EBBFLOW_TORCH_VARIANT") == "cpu":
    sys.meta_path.insert(0, _TorchWithoutCuda())
