"""Run vLLM's host-side metadata code on a machine without an accelerator (tests, benchmarks, demo).

vLLM's ROCM_AITER_FA extend path allocates host buffers with ``pin_memory=True``, which fails when
no accelerator runtime is present. ``unpinned_host_memory()`` is a torch function mode (scoped to a
``with`` block, nothing global is modified) that drops ``pin_memory=True`` from tensor factories, so
stock and plugin builders run the same code on CPU with ordinary host memory. On a GPU machine it is
not needed and not used.
"""

from __future__ import annotations

from typing import Any

from torch.overrides import TorchFunctionMode


class unpinned_host_memory(TorchFunctionMode):
    """Within the block, tensor factories ignore ``pin_memory=True``."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        if kwargs and kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
        return func(*args, **(kwargs or {}))
