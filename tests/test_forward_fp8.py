"""The forward tier on fp8 KV caches (``--kv-cache-dtype fp8``), MI300's e4m3fnuz and gfx950's
e4m3fn, with scales that are not 1: the cases themselves run with the others
(``tests/test_forward.py``); here, what makes them mean something.

- The references write and read the cache as vLLM's C op and AITER's kernels do (saturation,
  scales), pinned to their sources in ``reference_kernels``.
- AITER's ``unified_attention`` runs on the fp8 caches themselves (never widened), and its
  output agrees with the reference's on every call.
- Mutations: a reference that drops the scales, or a harness that widens the fp8 caches (so
  that AITER's kernel skips its descale), make the tier fail.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers import environment, forward_background, forward_checks, forward_child
from vllm_rocm_aiter_plugin.diagnostics.forward import harness, reference_kernels, runner
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES, FP8_EAGLE_CASE, FP8_FORMATS

pytestmark = [pytest.mark.cpu, pytest.mark.forward]

FP8_CASES = [c for c in CASES if c.fp8]


@pytest.fixture(scope="module")
def report() -> dict:
    return forward_background.report_or_skip()


_case = forward_checks.case_of


def test_fp8_cases_cover_both_formats_both_orders_and_scales_that_are_not_1():
    assert {c.fp8_format for c in FP8_CASES} == set(FP8_FORMATS)
    assert {c.order for c in FP8_CASES} == {"v1", "v2"}
    assert all(c.k_scale != 1.0 and c.v_scale != 1.0 for c in FP8_CASES)
    assert any(c.sliding_window for c in FP8_CASES) and any(c.spec_tokens for c in FP8_CASES)


def test_every_case_runs_on_cpu(report):
    """The CPU tier runs every fp8 format; only a non-causal case is set aside, where this
    release's model-runner V2 builds no non-causal batch, a shuffle-layout case, where stock's
    shuffle layout cannot run right on this release (or, with KV scales, where its cache write
    ignores them), and a sinks case, where this release's ROCM_AITER_FA takes no sinks."""
    set_aside = {c["case"] for c in report["cases"] if "not_applicable" in c}
    non_causal = {c.name for c in CASES if not c.causal}
    shuffle = {c.name for c in CASES if c.shuffle}
    expected = set() if runner.builds_non_causal_batches() else non_causal
    if harness.shuffle_layout_unavailable():
        expected |= shuffle
    if not runner.takes_sinks():
        expected |= {c.name for c in CASES if c.sinks}
    if report["shuffle_write_ignores_kv_scales"]:
        expected |= {c.name for c in CASES if c.shuffle and c.fp8 and c.k_scale != 1.0}
    assert set_aside == expected


@pytest.mark.parametrize("name", [c.name for c in FP8_CASES])
def test_fp8_case_reports_its_configuration(report, name):
    case = _case(report, name)
    wanted = next(c for c in FP8_CASES if c.name == name)
    assert case["configuration"]["kv_cache_dtype"] == "fp8"
    assert case["configuration"]["fp8_format"] == wanted.fp8_format


def test_aiters_kernel_reads_the_fp8_caches_unwidened(report):
    used = report["unified_attention"]
    if not used["aiter"] or used["calls"] is None:
        pytest.skip(f"AITER's kernel did not run here: {used['kernel']}")
    assert _case(report, FP8_EAGLE_CASE)["plugin"]["unified_attention_calls"] > 0
    assert used["fp8_cache_calls"] > 0
    assert used["cross_check_disagreements"] == 0, used


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


def _mutated(mutation: str, extra_env: dict[str, str] | None = None) -> dict:
    result = forward_child.run_in_child(
        names=[FP8_EAGLE_CASE], mutations=[mutation], extra_env=extra_env
    )
    if "unavailable" in result:
        pytest.skip(result["unavailable"])
    assert result["mutations"] == [mutation]
    return result


def _decode_rows_off(case: dict) -> set[str]:
    plugin = case["plugin"]
    assert "error" not in plugin, plugin.get("traceback", plugin.get("error"))
    return {
        r["req_id"]
        for r in plugin["rows"]
        if r["region"] == "decode" and (r["nan"] or r["error"] > case["tolerance"])
    }


@pytest.mark.subprocess
def test_mutation_a_reference_that_drops_the_scales_fails_the_tier(tmp_path):
    """The torch reference runs as ``unified_attention`` (an ``aiter`` package without AITER's
    Triton module first on the path) and ignores ``k_descale``/``v_descale``: the EAGLE rows it
    serves are off their reference, so the tier's plugin check fails."""
    (tmp_path / "aiter").mkdir()
    (tmp_path / "aiter" / "__init__.py").write_text("")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    result = _mutated("reference-drops-kv-scales", {"PYTHONPATH": path})
    assert not result["unified_attention"]["aiter"]
    case = result["cases"][0]
    assert _decode_rows_off(case) == {"decode-a", "decode-b"}
    with pytest.raises(AssertionError):
        forward_checks.check_plugin(case)


@pytest.mark.subprocess
def test_mutation_widened_fp8_caches_fail_the_tier():
    """AITER's kernel handed fp8 caches widened to float32 skips its descale: its rows are off,
    and the cross-check against the reference disagrees."""
    if not environment.pinned_aiter_installed():
        pytest.skip("the pinned amd-aiter wheel is not installed: AITER's kernel cannot run")
    result = _mutated("widened-fp8-caches")
    used = result["unified_attention"]
    assert used["aiter"], used["kernel"]
    assert used["cross_check_disagreements"] > 0
    assert _decode_rows_off(result["cases"][0]) == {"decode-a", "decode-b"}
