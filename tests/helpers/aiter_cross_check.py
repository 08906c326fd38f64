"""Child process of ``tests/forward/test_aiter_cross_check.py``: AITER's Triton
``unified_attention`` (loaded by ``tests/helpers/aiter_triton.py``) and the forward tier's torch
reference on the same random paged batches.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from tests.helpers import aiter_triton
from vllm_rocm_aiter_plugin.diagnostics.forward import reference_kernels


def inputs(shape: dict[str, Any]) -> dict[str, Any]:
    """vLLM's decode-path arguments for one shape."""
    generator = torch.Generator().manual_seed(shape["seed"])
    dtype = getattr(torch, shape["dtype"])
    bs, hk, d = shape["block_size"], shape["kv_heads"], shape["head_size"]
    q_lens, k_lens = shape["query_lens"], shape["key_lens"]
    blocks = [-(-k // bs) for k in k_lens]
    num_blocks = sum(blocks) + 1
    pool = torch.randperm(num_blocks, generator=generator)
    table = torch.zeros(len(k_lens), max([*blocks, 1]), dtype=torch.int32)
    taken = 0
    for row, count in enumerate(blocks):
        table[row, :count] = pool[taken : taken + count]
        taken += count
    rows = sum(q_lens)
    offsets = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator).to(dtype)

    scales = torch.ones(1).expand(len(k_lens), hk)  # vLLM's layer._k_scale.expand(...)
    window = shape["window"]
    arguments = {
        "q": randn(rows, hk * shape["queries_per_kv"], d),
        "k": randn(num_blocks, bs, hk, d),
        "v": randn(num_blocks, bs, hk, d),
        "out": torch.zeros(rows, hk * shape["queries_per_kv"], d, dtype=dtype),
        "cu_seqlens_q": offsets,
        "max_seqlen_q": max(q_lens),
        "seqused_k": torch.tensor(k_lens, dtype=torch.int32),
        "max_seqlen_k": max(k_lens),
        "softmax_scale": d**-0.5,
        "causal": True,
        "alibi_slopes": None,
        "window_size": (window - 1, 0) if window else (-1, -1),
        "block_table": table,
        "softcap": 0,
        "q_descale": None,
        "k_descale": scales,
        "v_descale": scales,
        "sinks": None,
    }
    return arguments


def compare(kernel: aiter_triton.AiterUnifiedAttention, shape: dict[str, Any]) -> dict[str, Any]:
    arguments = inputs(shape)
    want = arguments["out"].clone()
    reference_kernels.unified_attention(**{**arguments, "out": want})
    kernel(**arguments)
    error, agrees = aiter_triton.agreement(arguments["out"], want)
    return {**shape, "error": error, "agrees": agrees}


def active_driver() -> str:
    """What Triton's active driver is in this process (the interpreter's CPU machine: none)."""
    from triton.runtime import driver

    try:
        return type(driver.active).__name__
    except RuntimeError as exc:
        return f"none ({exc})"


def aiter_modules() -> list[str]:
    return sorted(name for name in sys.modules if name.split(".")[0] == "aiter")


def cross_check(shapes: list[dict[str, Any]]) -> dict[str, Any]:
    """In a fresh interpreter (``child.call``): AITER's kernel loaded, compared with the reference
    on each shape; the process's driver and ``aiter`` modules before and after the loading."""
    before = {"driver": active_driver(), "aiter_modules": aiter_modules()}
    kernel, why_not = aiter_triton.load_unified_attention()
    after = {"driver": active_driver(), "aiter_modules": aiter_modules()}
    if kernel is None:
        return {"unavailable": why_not}
    results = [compare(kernel, shape) for shape in shapes]
    report = {"kernel": kernel.origin, "results": results, "before": before, "after": after}
    return {**report, **kernel.to_json()}
