"""The forward tier's torch reference for AITER's ``unified_attention`` against AITER's own Triton
kernel, run under Triton's interpreter in a child process, on random paged batches.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import environment
from tests.helpers.depth import randomised
from tests.helpers.subprocess_util import REPO_ROOT
from vllm_rocm_aiter_plugin.diagnostics import child
from vllm_rocm_aiter_plugin.diagnostics.forward import harness

pytestmark = pytest.mark.project  # AITER's pinned kernel against the reference: no vLLM in it


def run_child(shapes: list[dict]) -> dict:
    done = child.finish(
        child.call("tests.helpers.aiter_cross_check:cross_check", shapes, cwd=REPO_ROOT,
                   env=harness.INTERPRETER_ENV, timeout=600)
    )  # fmt: skip
    assert done.result is not None, done.output[-4000:]
    report = done.result
    if "unavailable" in report:
        assert not environment.pinned_aiter_installed(), (
            f"the pinned amd-aiter is installed but its unified_attention does not load: "
            f"{report['unavailable']}"
        )
        pytest.skip(f"AITER's Triton unified_attention cannot run here: {report['unavailable']}")
    return report


@st.composite
def batches(draw: st.DrawFn) -> dict:
    seqs = draw(st.integers(1, 4))
    query_lens = draw(st.lists(st.integers(1, 5), min_size=seqs, max_size=seqs))
    long_keys = draw(st.booleans())  # over 512 keys: the kernel's 3D path where the grid is small
    key_lens = [draw(st.integers(q, 700 if long_keys else 200)) for q in query_lens]
    padded = draw(st.integers(0, 2))  # MRV2's padded requests: no queries, no keys
    return {
        "seed": draw(st.integers(0, 2**16)),
        "dtype": draw(st.sampled_from(["float16", "bfloat16"])),
        "query_lens": query_lens + [0] * padded,
        "key_lens": key_lens + [0] * padded,
        "queries_per_kv": draw(st.sampled_from([1, 2, 4, 8])),
        "kv_heads": draw(st.integers(1, 2)),
        "head_size": draw(st.sampled_from([64, 128])),
        "block_size": draw(st.sampled_from([16, 32])),
        "window": draw(st.sampled_from([0, 0, 1, 7, 64])),
    }


def check(report: dict) -> None:
    assert report["kernel"].startswith("AITER's Triton unified_attention"), report["kernel"]
    for result in report["results"]:
        assert result["agrees"], f"reference and AITER's kernel differ: {result}"


@randomised(4)
@given(st.lists(batches(), min_size=4, max_size=4))
def test_reference_agrees_with_aiters_kernel_on_random_batches(shapes):
    check(run_child(shapes))


def test_a_bf16_batch_agrees_through_the_widening_and_the_shims_hold_for_the_import_only():
    """Control: bf16 goes through the widening, and a bf16 batch still agrees. The shims hold for
    the import only: afterwards Triton's active driver is what it was and no ``aiter`` module is
    left in ``sys.modules``."""
    shape = {
        "seed": 1, "dtype": "bfloat16", "query_lens": [4, 1, 0], "key_lens": [300, 17, 0],
        "queries_per_kv": 2, "kv_heads": 1, "head_size": 64, "block_size": 16, "window": 0,
    }  # fmt: skip
    report = run_child([shape])
    check(report)
    assert report["bf16_widened_calls"] == 1
    assert report["after"] == report["before"], report
    assert report["after"]["aiter_modules"] == []
