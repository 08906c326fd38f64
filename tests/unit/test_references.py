"""The forward tier's torch references, on their own: the fp8 cache write and the shuffle layout's
write and decode, against what their sources say (``diagnostics/forward/reference_kernels.py``).
The tier runs them on every case (``tests/forward/test_forward.py``)."""

from __future__ import annotations

import pytest
import torch

from vllm_rocm_aiter_plugin.diagnostics.forward import reference_kernels
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import FP8_FORMATS


@pytest.mark.parametrize("fp8_format", sorted(FP8_FORMATS))
def test_cache_write_saturates_and_keeps_nan(fp8_format):
    """Out-of-range values become the largest finite value of their sign (``__HIP_SATFINITE``),
    where torch's own cast to e4m3fnuz gives NaN; NaN stays NaN."""
    dtype = getattr(torch, fp8_format)
    largest = torch.finfo(dtype).max
    x = torch.tensor([1000.0, -1000.0, 0.5, float("nan")], dtype=torch.float16)
    written = reference_kernels.quantise(x, dtype, 0.5).float()
    assert written[:2].tolist() == [largest, -largest]
    assert written[2].item() == 1.0
    assert written[3].isnan()


def test_fp16_values_are_divided_in_fp16_before_the_cast():
    """``tmp.data /= scale`` on a half: the quotient is rounded to fp16 before the fp8 cast.
    1.1875 / 1.00001 is just below e4m3's midpoint between 1.125 and 1.25 in float32, and on it
    in fp16, where the tie goes to the even 1.25."""
    x = torch.tensor([1.1875], dtype=torch.float16)
    assert float((x.float() / 1.00001).to(torch.float8_e4m3fn).float()) == 1.125  # float32 path
    assert float(reference_kernels.quantise(x, torch.float8_e4m3fn, 1.00001).float()) == 1.25


def _cache(blocks: int, block_size: int, heads: int, d: int, dtype: torch.dtype) -> tuple:
    planes = torch.zeros(2, blocks, block_size, heads * d, dtype=dtype).transpose(0, 1)
    key_cache, value_cache = planes.unflatten(-1, (heads, d)).unbind(1)
    return key_cache, value_cache


def test_the_shuffle_write_reference_puts_each_token_where_the_layout_reads_it():
    """Written by the reference, read back through the 5-D views: every token at its slot."""
    torch.manual_seed(0)
    blocks, block_size, heads, d = 3, 16, 2, 64
    key_cache, value_cache = _cache(blocks, block_size, heads, d, torch.bfloat16)
    key, value = torch.randn(10, heads, d).bfloat16(), torch.randn(10, heads, d).bfloat16()
    slots = torch.randperm(blocks * block_size)[:10]
    slots[3] = -1  # padding: skipped
    ones = torch.ones(1)
    reference_kernels.reshape_and_cache_flash(
        key, value, key_cache, value_cache, slots, "auto", ones, ones, shuffle=True
    )
    keys, values = reference_kernels.unshuffled(
        *reference_kernels.shuffled_views(key_cache, value_cache)
    )
    flat_k, flat_v = keys.reshape(-1, heads, d), values.reshape(-1, heads, d)
    kept = slots >= 0
    assert torch.equal(flat_k[slots[kept]], key[kept])
    assert torch.equal(flat_v[slots[kept]], value[kept])
    assert int((flat_k != 0).any(-1).any(-1).sum()) == int(kept.sum())


def _decode_inputs(dtype: torch.dtype, kv_cache_dtype: str, scale: float) -> dict:
    torch.manual_seed(1)
    blocks, block_size, heads, d = 4, 16, 1, 64
    key_cache, value_cache = _cache(blocks, block_size, heads, d, dtype)
    lengths = [20, 33]
    table = torch.tensor([[2, 0, 0], [1, 3, 0]], dtype=torch.int32)
    slots = torch.cat(
        [
            table[b, torch.arange(n) // block_size].long() * block_size
            + torch.arange(n) % block_size
            for b, n in enumerate(lengths)
        ]
    )
    key, value = torch.randn(len(slots), heads, d).half(), torch.randn(len(slots), heads, d).half()
    scales = torch.full((1,), scale)
    reference_kernels.reshape_and_cache_flash(
        key, value, key_cache, value_cache, slots, kv_cache_dtype, scales, scales, shuffle=True
    )
    k5, v5 = reference_kernels.shuffled_views(key_cache, value_cache)
    return dict(
        Q=torch.randn(2, 2, d).half(), K=k5, V=v5, tmp_out=None, max_logits=None, exp_sums=None,
        max_seq_len=max(lengths), block_tables=table, context_lens=torch.tensor(lengths),
        block_tables_stride0=table.stride(0), scale=d**-0.5, K_QScale_hip=scales,
        V_QScale_hip=scales, K_QScale_asm=None, V_QScale_asm=None, out_=None,
        kv_cache_dtype=kv_cache_dtype,
    )  # fmt: skip


@pytest.mark.parametrize("fp8_dtype", reference_kernels.FP8_DTYPES, ids=str)
def test_the_shuffle_decode_reference_reads_what_the_write_stored(fp8_dtype):
    """``paged_attention_common`` over the shuffle layout equals ``paged_attention_v1`` over the
    same tokens laid out NHD, with the scale applied."""
    inputs = _decode_inputs(fp8_dtype, "fp8", 0.05)
    out = reference_kernels.paged_attention_common(**inputs)
    keys, values = reference_kernels.unshuffled(inputs["K"], inputs["V"])
    want = torch.empty_like(out)
    reference_kernels.paged_attention_v1(
        want, torch.empty(0), inputs["Q"], keys, values, inputs["scale"], inputs["block_tables"],
        None, inputs["context_lens"], inputs["max_seq_len"], None, "fp8", "NHD", 0.0,
        inputs["K_QScale_hip"], inputs["V_QScale_hip"],
    )  # fmt: skip
    assert torch.equal(out, want)


def test_the_shuffle_decode_reference_refuses_what_the_kernel_cannot_read():
    """K and V interleaved within a block (0.23.0's cache) are not dense planes of pages; scale
    tables that disagree with the per-tensor scale describe two caches."""
    inputs = _decode_inputs(torch.float8_e4m3fnuz, "fp8", 0.05)
    interleaved = torch.zeros(4, 2, 16, 1, 64, dtype=torch.float8_e4m3fnuz)
    k5, v5 = reference_kernels.shuffled_views(*interleaved.unbind(1))
    with pytest.raises(reference_kernels.LauncherError, match="dense plane"):
        reference_kernels.paged_attention_common(**{**inputs, "K": k5, "V": v5})
    table = torch.ones(4, 1, 16)  # the builder's scale table of ones, where the scale is 0.05
    with pytest.raises(reference_kernels.LauncherError, match="other values"):
        reference_kernels.paged_attention_common(**{**inputs, "K_QScale_asm": table})
