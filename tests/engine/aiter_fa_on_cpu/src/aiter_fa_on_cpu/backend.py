"""``ROCM_AITER_FA`` as vLLM's registry holds it, made runnable on CPU as the forward tier runs it."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

GATHER_BUDGET = 128
"""Context gathers up to this many tokens run vLLM's Triton kernel; larger ones the reference,
checked against the kernel on their first tokens (the interpreter is slow)."""

AITER_CALLS = 64
"""AITER's kernel (cross-checked) serves the first this many calls of a process, the reference
the rest: the forward tier checks the kernel itself, this tier the serving."""

_process_lifetime = contextlib.ExitStack()
_state: dict[str, Any] = {"layers": 0}


@functools.cache
def runnable() -> type:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_rocm_aiter_plugin.diagnostics.forward import harness, reference_kernels, runner

    backend = AttentionBackendEnum.ROCM_AITER_FA.get_class()
    device = torch.device("cpu")
    unavailable = runner.why_unavailable(device)
    if unavailable:
        raise RuntimeError(f"ROCM_AITER_FA cannot run in this CPU process: {unavailable}")
    # AITER's own Triton kernel, cross-checked call by call, where its wheel loads (the server runs
    # from the repository's root: tests.helpers is importable)
    from tests.helpers.forward_child import unified_attention as aiter_or_reference

    unified_attention = aiter_or_reference(device, aiter_kernel=True, budget=AITER_CALLS)
    _process_lifetime.enter_context(reference_kernels.installed(unified_attention))
    kernel, _ = harness.vllm_rocm_kernel(harness.GATHER_NAME)
    gather = harness.Gather(kernel, GATHER_BUDGET)
    _state.update(backend=f"{backend.__module__}.{backend.__qualname__}",
                  unified_attention=unified_attention, gather=gather)  # fmt: skip
    runnable_backend = harness.runnable_backend(backend, gather)
    impl = _counted(runnable_backend.get_impl_cls())
    builder = _unpinned(runnable_backend.get_builder_cls())
    return type(
        backend.__name__,
        (runnable_backend,),
        {
            "get_impl_cls": staticmethod(lambda: impl),
            "get_builder_cls": staticmethod(lambda: builder),
        },
    )


def _counted(impl_cls: type) -> type:
    """``impl_cls`` counting the layers it serves (the target's and a draft's)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        impl_cls.__init__(self, *args, **kwargs)
        _state["layers"] += 1

    return type(impl_cls.__name__, (impl_cls,), {"__init__": __init__})


def _unpinned(builder_cls: type) -> type:
    """``builder_cls`` whose ``build`` allocates ordinary host memory where it asks for pinned
    (stock's extend path does; no allocator pins memory without an accelerator)."""
    from vllm_rocm_aiter_plugin.diagnostics.cpu_host import unpinned_host_memory

    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        with unpinned_host_memory():
            return builder_cls.build(self, *args, **kwargs)

    return type(builder_cls.__name__, (builder_cls,), {"build": build})


def usage() -> dict[str, Any]:
    """What served ``ROCM_AITER_FA`` in this process so far (empty where nothing selected it):
    whose backend, how many layers, AITER's ``unified_attention`` and vLLM's gather calls."""
    if "backend" not in _state:
        return {}
    unified_attention, gather = _state["unified_attention"], _state["gather"]
    return {
        "backend": _state["backend"],
        "layers": _state["layers"],
        "unified_attention": unified_attention.to_json() if unified_attention else None,
        "gather": {"kernel": gather.kernel_calls, "reference": gather.reference_calls},
    }


def __getattr__(name: str) -> Any:
    if name == "RunnableAiterFlashAttentionBackend":
        return runnable()
    raise AttributeError(name)
