"""Run vLLM's host-side metadata code on a machine without an accelerator (tests, benchmarks, demo)."""

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
