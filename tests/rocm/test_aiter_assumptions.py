"""MI300 tier, first-run check: what the CPU tier's torch references assume of AITER's
``flash_attn_varlen_func``, asked of the real kernel, called as vLLM's extend path calls it.
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch

from vllm_rocm_aiter_plugin.diagnostics.forward import reference_kernels
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES, TOLERANCE

pytestmark = [pytest.mark.rocm, pytest.mark.mi300, pytest.mark.forward]

SHAPES = sorted({(c.dtype, c.head_size, c.num_heads, c.num_kv_heads) for c in CASES})
"""(dtype, head size, query heads, kv heads) of every forward case."""
Q_LENS = [3, 5, 1, 4]
K_LENS = [7, 0, 0, 300]  # key-less sequences that are not the first (mha.py's early-exit store)


def _offsets(lengths: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def _extend_call(q, k, v, q_lens, k_lens, causal, sink_ptr=None):
    """``rocm_aiter_ops.flash_attn_varlen_func`` with the keywords vLLM's extend path passes
    (those this release's wrapper takes)."""
    from vllm._aiter_ops import rocm_aiter_ops

    arguments = {
        "q": q, "k": k, "v": v,
        "cu_seqlens_q": _offsets(q_lens, q.device), "cu_seqlens_k": _offsets(k_lens, q.device),
        "max_seqlen_q": max(q_lens), "max_seqlen_k": max(k_lens), "min_seqlen_q": min(q_lens),
        "dropout_p": 0.0, "softmax_scale": q.shape[-1] ** -0.5, "causal": causal,
        "window_size": (-1, -1), "alibi_slopes": None, "return_lse": True, "sink_ptr": sink_ptr,
    }  # fmt: skip
    accepted = inspect.signature(rocm_aiter_ops.flash_attn_varlen_func).parameters
    return rocm_aiter_ops.flash_attn_varlen_func(
        **{name: value for name, value in arguments.items() if name in accepted}
    )


def _inputs(dtype: str, head: int, heads: int, kv_heads: int, device: torch.device):
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(getattr(torch, dtype)).to(device)

    return (
        randn(sum(Q_LENS), heads, head),
        randn(sum(K_LENS), kv_heads, head),
        randn(sum(K_LENS), kv_heads, head),
    )


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_key_less_rows_give_output_0_and_lse_minus_inf(device, shape):
    """Non-causal, ``return_lse=True``, some ``seqlen_k = 0`` rows: vLLM's context-chunk call."""
    q, k, v = _inputs(*shape, device)
    out, lse = _extend_call(q, k, v, Q_LENS, K_LENS, causal=False)
    assert tuple(lse.shape) == (q.shape[1], q.shape[0]), (
        f"assumption 'lse is [heads, tokens]' broken: lse is {tuple(lse.shape)} for "
        f"{q.shape[1]} heads and {q.shape[0]} tokens"
    )
    assert lse.dtype == torch.float32, f"assumption 'lse is float32' broken: {lse.dtype}"
    starts = _offsets(Q_LENS, torch.device("cpu")).tolist()
    for i, keys in enumerate(K_LENS):
        rows = slice(starts[i], starts[i + 1])
        if keys:
            continue
        assert bool((out[rows] == 0).all()), (
            f"assumption 'output 0 for a row with no keys' broken on sequence {i} "
            f"({shape}): largest |out| {float(out[rows].abs().max())}"
        )
        assert bool(torch.isneginf(lse[:, rows]).all()), (
            f"assumption 'lse -inf for a row with no keys' broken on sequence {i} ({shape}): "
            f"lse {lse[:, rows].flatten().tolist()[:8]}"
        )


@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal-bottom-right"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_the_reference_equals_the_kernel(device, shape, causal):
    """Output and lse of every row against the CPU tier's reference; causal with fewer queries
    than keys shows where the mask is aligned (the reference: bottom right)."""
    q, k, v = _inputs(*shape, device)
    out, lse = _extend_call(q, k, v, Q_LENS, K_LENS, causal=causal)
    want, want_lse = reference_kernels.flash_attn_varlen_func(
        q.cpu(), k.cpu(), v.cpu(), _offsets(Q_LENS, torch.device("cpu")),
        _offsets(K_LENS, torch.device("cpu")), max(Q_LENS), max(K_LENS),
        softmax_scale=q.shape[-1] ** -0.5, causal=causal, return_lse=True,
    )  # fmt: skip
    assumption = "causal mask aligned to the bottom right" if causal else "non-causal attention"
    error = float((out.cpu().float() - want.float()).abs().max())
    assert error <= TOLERANCE[shape[0]], f"assumption '{assumption}' broken ({shape}): {error}"
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite), (
        f"assumption '{assumption}': the rows with no key to attend to differ ({shape})"
    )
    lse_error = float((lse.cpu()[finite] - want_lse[finite]).abs().max())
    assert lse_error <= 1e-2, f"assumption 'lse of {assumption}' broken ({shape}): {lse_error}"


SINK_SHAPES = sorted(
    {(c.dtype, c.head_size, c.num_heads, c.num_kv_heads) for c in CASES if c.sinks}
)


@pytest.mark.parametrize("shape", SINK_SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_each_call_counts_the_sink_once_and_a_key_less_row_gets_it_as_lse(device, shape):
    """The sink semantics the references take from CK's source (``reference_kernels.attend``):
    the sink in the call's softmax and lse once; a row with no keys gives output 0 and lse = the
    sink. The plugin's impl (and the proposed upstream fix) relies on it to count the sink once."""
    from vllm_rocm_aiter_plugin.diagnostics import probe

    if not probe.takes_sinks():
        pytest.skip("this release's ROCM_AITER_FA takes no attention sinks (no sink_ptr to pass)")
    case = next(c for c in CASES if c.sinks and shape[2] == c.num_heads)
    sink = case.sink_tensor(device)
    q, k, v = _inputs(*shape, device)
    out, lse = _extend_call(q, k, v, Q_LENS, K_LENS, causal=False, sink_ptr=sink)
    want, want_lse = reference_kernels.flash_attn_varlen_func(
        q.cpu(), k.cpu(), v.cpu(), _offsets(Q_LENS, torch.device("cpu")),
        _offsets(K_LENS, torch.device("cpu")), max(Q_LENS), max(K_LENS),
        softmax_scale=q.shape[-1] ** -0.5, causal=False, return_lse=True, sink_ptr=sink.cpu(),
    )  # fmt: skip
    error = float((out.cpu().float() - want.float()).abs().max())
    assert error <= TOLERANCE[shape[0]], f"assumption 'the sink counted once' broken: {error}"
    lse_error = float((lse.cpu() - want_lse).abs().max())
    assert lse_error <= 1e-2, (
        f"assumption 'lse includes the sink; lse = sink without keys': {lse_error}"
    )


@pytest.mark.parametrize("shape", SINK_SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_the_causal_new_token_call_counts_the_sink_once(device, shape):
    """The one call the plugin gives the sink: causal, the queries' own tokens as keys. Its lse
    must be the sink-free call's lse with the sink added once, ``logaddexp(lse, sink)``, and its
    output the sink-free output scaled by ``exp(lse - lse_with_sink)``. A CK that sets the sink
    to -inf under a mask (without AITER's compensation) drops it here, and the plugin would then
    count it zero times; so does AITER's v3 assembly route, stock and the plugin alike
    (docs/upstream/aiter.md)."""
    from vllm_rocm_aiter_plugin.diagnostics import probe

    if not probe.takes_sinks():
        pytest.skip("this release's ROCM_AITER_FA takes no attention sinks (no sink_ptr to pass)")
    case = next(c for c in CASES if c.sinks and shape[2] == c.num_heads)
    sink = case.sink_tensor(device)
    q_lens = [3, 5, 1, 4]
    q, k, v = (t[: sum(q_lens)] for t in _inputs(*shape, device))
    out, lse = _extend_call(q, k, v, q_lens, q_lens, causal=True)
    out_sink, lse_sink = _extend_call(q, k, v, q_lens, q_lens, causal=True, sink_ptr=sink)
    want_lse = torch.logaddexp(lse.float(), sink.float()[:, None])
    lse_error = float((lse_sink.float() - want_lse).abs().max())
    assert lse_error <= 1e-2, (
        f"assumption 'the causal call's lse counts the sink once' broken ({shape}): {lse_error}; "
        "the plugin gives the sink to this call only"
    )
    weight = torch.exp(lse.float() - lse_sink.float()).transpose(0, 1)[..., None]
    error = float((out_sink.float() - out.float() * weight).abs().max())
    assert error <= TOLERANCE[shape[0]], (
        f"assumption 'the causal call's output is scaled by the sink once' broken ({shape}): "
        f"{error}"
    )
