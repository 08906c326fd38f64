"""The forward tier under the shuffle KV-cache layout (``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1``):
the cases run with the others (``tests/test_forward.py`` judges every row); here, what makes them
mean something.

- The layout is switched on for vLLM's methods in the forward child only (private globals that
  see a ``rocm_aiter_ops`` answering True); the process's own flag is never set.
- The plugin's builder takes its fallback branch there, vLLM's build() code with the plugin's
  split, and its own body everywhere else.
- vLLM's own shuffle write and context gather run (the Triton interpreter on CPU); AITER's
  ``paged_attention_common`` has a reference that reads the layout as ``pa_fwd`` documents it
  and refuses what the kernel cannot read.
"""

from __future__ import annotations

import pytest
import torch
import vllm

from tests.helpers import forward_background
from vllm_rocm_aiter_plugin import releases
from vllm_rocm_aiter_plugin.builder import own_build_enabled
from vllm_rocm_aiter_plugin.diagnostics.forward import harness, reference_kernels
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES, FP8_FORMATS

pytestmark = [pytest.mark.cpu, pytest.mark.forward]

SHUFFLE_CASES = [c for c in CASES if c.shuffle]


@pytest.fixture(scope="module")
def report() -> dict:
    return forward_background.report_or_skip()


def _ran(report: dict) -> list[dict]:
    return [c for c in report["cases"] if c["case"] in {s.name for s in SHUFFLE_CASES}]


def _applicable(report: dict) -> set[str]:
    return {c["case"] for c in _ran(report) if "not_applicable" not in c}


def test_shuffle_cases_cover_both_orders_both_fp8_formats_and_a_16_bit_cache():
    assert {c.order for c in SHUFFLE_CASES} == {"v1", "v2"}
    assert {c.fp8_format for c in SHUFFLE_CASES if c.fp8} == set(FP8_FORMATS)
    assert any(not c.fp8 for c in SHUFFLE_CASES)
    assert all(c.k_scale != 1.0 for c in SHUFFLE_CASES if c.fp8)
    # the layout refuses EAGLE's multi-token decodes and sliding windows (vLLM's asserts)
    assert not any(c.spec_tokens or c.sliding_window for c in SHUFFLE_CASES)


def test_the_shuffle_gather_reads_two_context_chunks_with_a_context_free_row(report):
    """The layout's gather, chunk by chunk, in an extend region holding a moved new prompt."""
    case = next(c for c in _ran(report) if c["case"] == "multi-chunk-v2-shuffle-fp8")
    if "not_applicable" in case:
        pytest.skip(case["not_applicable"])
    plugin = case["plugin"]
    assert plugin["chunks"] == 2
    moved = [r for r in plugin["rows"] if r["region"] == "extend" and not r["context"]]
    assert [r["req_id"] for r in moved] == ["new-prompt"]


def _scaled_fp8(name: str) -> bool:
    case = next(c for c in SHUFFLE_CASES if c.name == name)
    return case.fp8 and case.k_scale != 1.0


def test_shuffle_cases_run_where_stocks_layout_runs(report):
    """Set aside exactly where stock's layout cannot run; and the fp8 cases with KV scales where
    this release's cache write ignores them (0.30: stock's and the plugin's alike)."""
    unavailable = harness.shuffle_layout_unavailable()
    ignores = report["shuffle_write_ignores_kv_scales"]
    assert not isinstance(ignores, str), ignores  # the probe itself failed
    for case in _ran(report):
        why = case.get("not_applicable")
        if unavailable is None and ignores and _scaled_fp8(case["case"]):
            assert why is not None and "ignores the KV scales" in why, case["case"]
        else:
            assert why == unavailable, case["case"]


def test_the_shuffle_write_keeps_the_kv_scales_on_the_ci_releases(report):
    """The probe behind that set-aside, held to the CI releases' facts: 0.33's write keeps the
    scales, and 0.23's layout does not run."""
    if vllm.__version__ not in releases.CI:
        pytest.skip(f"vLLM {vllm.__version__} is not a CI release; the facts cover those only")
    runs = vllm.__version__ in releases.SHUFFLE_LAYOUT_RUNS
    assert report["shuffle_write_ignores_kv_scales"] is (False if runs else None)


def test_the_plugins_builder_runs_vllms_build_under_shuffle_and_its_own_elsewhere(report):
    own = "own" if own_build_enabled() else "vllm-build"
    bodies = {
        c["case"]: c["plugin"].get("builder_body")
        for c in report["cases"]
        if "plugin" in c and "error" not in c["plugin"]
    }
    shuffle = {c.name for c in SHUFFLE_CASES}
    for name, body in bodies.items():
        assert body == ("vllm-build" if name in shuffle else own), name
    if harness.shuffle_layout_unavailable() is None:
        assert _applicable(report) <= set(bodies)


def test_vllms_shuffle_write_ran_on_every_shuffle_step(report):
    from vllm.v1.attention.backends import rocm_aiter_fa

    if harness.shuffle_layout_unavailable():
        pytest.skip(harness.shuffle_layout_unavailable())
    if harness.SHUFFLE_WRITE_NAME in vars(rocm_aiter_fa):
        pytest.skip("on ROCm the tier runs vLLM's own shuffle write as it is, uncounted")
    calls = report["shuffle_write_calls"]
    # each case writes its context, then its new tokens, once per backend (stock, plugin)
    ran = [c for c in SHUFFLE_CASES if c.name in _applicable(report)]
    assert calls["kernel"] == 4 * len(ran)
    fp8_cases = [c for c in ran if c.fp8]
    if report["device"] == "cpu":  # the reference writes fp8 caches (the interpreter's rounding)
        assert calls["reference"] == 4 * len(fp8_cases)


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
    reference_kernels.reshape_and_cache_shuffle(
        key, value, key_cache, value_cache, slots, "auto", ones, ones
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
    reference_kernels.reshape_and_cache_shuffle(
        key, value, key_cache, value_cache, slots, kv_cache_dtype, scales, scales
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
