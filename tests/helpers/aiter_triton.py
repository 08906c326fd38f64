"""AITER's own Triton ``unified_attention``, loaded from an installed ``amd-aiter`` wheel into a
CPU process, for the forward tier to run under Triton's interpreter instead of the torch reference
the commands run.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm_rocm_aiter_plugin.diagnostics.forward import reference_kernels
from vllm_rocm_aiter_plugin.diagnostics.forward.harness import UnifiedAttention
from vllm_rocm_aiter_plugin.rebind import with_globals

MODULE = "aiter.ops.triton.unified_attention"
BARE_PACKAGES = ("aiter", "aiter.ops", "aiter.ops.triton")
TARGET = ("hip", "gfx942", 64)
"""What Triton's active driver answers during the import: MI300X (gfx942, 64-wide wavefronts)."""
MI300X_COMPUTE_UNITS = 304


def agreement(got: torch.Tensor, want: torch.Tensor) -> tuple[float, bool]:
    """(largest |got - want|, whether every element is within two units in the last place of
    ``got``'s dtype at the larger of 1 and |want|): two roundings of nearly the same float32."""
    eps = torch.finfo(got.dtype).eps
    got, want = got.float(), want.float()
    error = (got - want).abs()
    bound = 2 * eps * want.abs().clamp(min=1.0)
    return float(error.max()) if error.numel() else 0.0, bool((error <= bound).all())


def _digest(arguments: dict[str, Any]) -> bytes:
    """The kernel's inputs, by value: each tensor's dtype, shape and contents, the rest by repr."""
    digest = hashlib.blake2b(digest_size=32)
    for name, value in sorted(arguments.items()):
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
            bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
            # numpy reads any strides (0 included); an integer view of the same width keeps them
            digest.update(value.detach().view(bits[value.element_size()]).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.digest()


@dataclass
class AiterUnifiedAttention(UnifiedAttention):
    """AITER's kernel as the forward runs it: bf16 calls widened to float32 (above), every call
    also run through the torch reference on the same inputs and the two outputs compared
    (:func:`agreement`). The interpreter is deterministic: with ``reuse`` (the forward tier, where
    stock, the plugin and observe mode make the same decode calls) a call whose inputs equal an
    earlier call's gets that run's output, where that run wrote every element of its output with
    a number (:meth:`run`)."""

    widen_bf16: bool = True
    reference: Callable[..., None] | None = None  # None: reference_kernels.unified_attention
    widen_fp8_caches: bool = False  # a mutation only: what a careless widening does
    budget: int | None = None  # after this many calls, the reference alone (the engine tier)
    reuse: bool = False  # off in the engine tier: its calls never repeat, its caches are large
    reference_only_calls: int = 0
    bf16_widened_calls: int = 0
    fp8_cache_calls: int = 0
    checks: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[bytes, torch.Tensor] = field(default_factory=dict, repr=False)
    repeated_calls: int = 0

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 **kwargs: Any) -> None:  # fmt: skip
        reference_kernels.check_unified_attention(q, out, **kwargs)
        self.calls += 1
        if self.budget is not None and len(self.checks) >= self.budget:
            self.reference_only_calls += 1
            (self.reference or reference_kernels.unified_attention)(q, k, v, out, **kwargs)
            return
        fp8 = k.dtype in reference_kernels.FP8_DTYPES
        self.fp8_cache_calls += fp8
        before = out.clone()
        widen_q = self.widen_bf16 and q.dtype == torch.bfloat16
        widen_caches = (widen_q and not fp8) or self.widen_fp8_caches
        if widen_q or widen_caches:
            self.bf16_widened_calls += widen_q
            wide = out.float()  # rows the kernel does not write keep what the caller's buffer held
            caches = (k.float(), v.float()) if widen_caches else (k, v)
            self.run(q=q.float(), k=caches[0], v=caches[1], out=wide, **kwargs)
            out.copy_(wide)
        else:
            self.run(q=q, k=k, v=v, out=out, **kwargs)
        (self.reference or reference_kernels.unified_attention)(q, k, v, before, **kwargs)
        error, agrees = agreement(out, before)
        self.checks.append({"dtype": str(q.dtype).removeprefix("torch."), "error": error,
                            "agrees": agrees, "seqs": len(kwargs["seqused_k"])})  # fmt: skip

    def run(self, out: torch.Tensor, **inputs: Any) -> None:
        """The kernel on ``inputs`` into ``out``, once per distinct ``inputs``: the first run
        writes into a NaN-filled buffer; if no NaN is left (every element written, none made
        NaN) its output is kept for a later call with equal inputs, otherwise the kernel runs
        again into ``out`` itself (what it leaves unwritten keeps the caller's values)."""
        if not self.reuse or out.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            self.function(out=out, **inputs)
            return
        key = _digest(inputs)
        kept = self.outputs.get(key)
        if kept is not None and kept.shape == out.shape and kept.dtype == out.dtype:
            self.repeated_calls += 1
            out.copy_(kept)
            return
        written = torch.full_like(out, float("nan"))
        self.function(out=written, **inputs)
        if written.isnan().any():
            self.function(out=out, **inputs)
            return
        self.outputs[key] = written
        out.copy_(written)

    @contextlib.contextmanager
    def reference_alone(self) -> Iterator[None]:
        """The calls in the block run the torch reference alone: a control that judges the
        metadata, not the kernel."""
        budget, self.budget = self.budget, len(self.checks)
        try:
            yield
        finally:
            self.budget = budget

    def to_json(self) -> dict[str, Any]:
        largest: dict[str, float] = {}
        for check in self.checks:
            largest[check["dtype"]] = max(largest.get(check["dtype"], 0.0), check["error"])
        return {
            **super().to_json(),
            "bf16_widened_calls": self.bf16_widened_calls,
            "fp8_cache_calls": self.fp8_cache_calls,
            "cross_checked_calls": len(self.checks),
            "reference_only_calls": self.reference_only_calls,
            "repeated_calls": self.repeated_calls,
            "cross_check_disagreements": sum(not c["agrees"] for c in self.checks),
            "cross_check_largest_error": largest,
        }


def _bare_package(name: str, folder: Path) -> types.ModuleType:
    module = types.ModuleType(name, "bare package: its __init__ is not run (forward tier)")
    spec = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    module.__spec__ = spec
    module.__path__ = [str(folder)]
    return module


class _HipTarget:
    """Triton's active driver for the length of AITER's import: answers AITER's arch query."""

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget(*TARGET)

    def get_current_device(self) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


@contextlib.contextmanager
def loading(root: Path) -> Iterator[None]:
    """Bare ``aiter`` packages and a HIP target for the import; afterwards ``sys.modules`` and
    Triton's active driver are as they were."""
    from triton.runtime import driver

    def aiter_modules() -> list[str]:
        return [name for name in sys.modules if name == "aiter" or name.startswith("aiter.")]

    before = {name: sys.modules.pop(name) for name in aiter_modules()}  # e.g. a failed import's
    try:
        previous = driver.active
    except (RuntimeError, TypeError):  # none usable on a machine without a GPU (no driver, or
        previous = None  # an abstract one, as vLLM's CPU build leaves it): left unset again
    for name in BARE_PACKAGES:
        sys.modules[name] = _bare_package(name, root.joinpath(*name.split(".")[1:]))
    driver.set_active(_HipTarget())
    try:
        yield
    finally:
        driver.set_active(previous)
        for name in aiter_modules():
            del sys.modules[name]
        sys.modules.update(before)


def _distribution() -> str:
    names = importlib.metadata.packages_distributions().get("aiter") or ["aiter"]
    try:
        return f"{names[0]} {importlib.metadata.version(names[0])}"
    except importlib.metadata.PackageNotFoundError:
        return names[0]


def aiter_root() -> Path | None:
    """Where the installed ``aiter`` package lives (found, not imported), or None."""
    spec = importlib.util.find_spec("aiter")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def load_unified_attention(
    budget: int | None = None, reuse: bool = False
) -> tuple[AiterUnifiedAttention | None, str]:
    """AITER's ``unified_attention`` ready to run in this CPU process (on its first ``budget``
    calls, None: all; ``reuse``: see :class:`AiterUnifiedAttention`), or None and why not."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None, "AITER's Triton kernels run on CPU only under TRITON_INTERPRET=1"
    root = aiter_root()
    if root is None:
        return None, "no aiter package is installed (the amd-aiter wheel)"
    if not root.joinpath("ops", "triton", "unified_attention.py").is_file():
        return None, f"the aiter package at {root} has no ops/triton/unified_attention.py"
    try:
        with loading(root):
            module = importlib.import_module(MODULE)
        function = with_globals(
            module.unified_attention, {"get_num_sms": lambda: MI300X_COMPUTE_UNITS}
        )
    except Exception as exc:  # an AITER this loader does not know: fall back, say why
        return (
            None,
            f"{MODULE} of {_distribution()} does not load here: {type(exc).__name__}: {exc}",
        )
    origin = (
        f"AITER's Triton unified_attention ({_distribution()}, {root}), "
        "under the Triton interpreter"
    )
    kernel = AiterUnifiedAttention(function, origin, is_aiter=True, budget=budget, reuse=reuse)
    return kernel, origin
