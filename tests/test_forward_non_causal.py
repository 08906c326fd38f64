"""The forward tier on a non-causal batch (``CommonAttentionMetadata.causal`` False, which 0.33's
model-runner V2 builds): ROCM_AITER_FA's prefill kernel honours it, its extend path runs causally
whatever the batch says (``docs/upstream/README.md``), so the plugin gives stock's regions there
(``docs/deviations.md``). The case runs with the others (``tests/test_forward.py``, whose checks
judge it as non-causal); here, what it shows.
"""

from __future__ import annotations

import pytest

from tests.helpers import forward_background, forward_checks
from vllm_rocm_aiter_plugin.diagnostics.forward import runner
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES

pytestmark = [pytest.mark.cpu, pytest.mark.forward]

NON_CAUSAL = [c.name for c in CASES if not c.causal]


@pytest.fixture(scope="module")
def report() -> dict:
    return forward_background.report_or_skip()


def _case(report: dict, name: str) -> dict:
    case = next(c for c in report["cases"] if c["case"] == name)
    if "not_applicable" in case:
        assert not runner.builds_non_causal_batches()
    return forward_checks.case_of(report, name)


def test_there_is_a_v2_non_causal_case_with_a_new_prompt_before_a_row_with_context():
    case = next(c for c in CASES if c.name in NON_CAUSAL)
    rows = case.ordered()
    first_with_context = next(i for i, r in enumerate(rows) if r.context_len and r.query_len > 1)
    assert case.order == "v2"
    assert any(not r.context_len and r.query_len > 1 for r in rows[:first_with_context])


@pytest.mark.parametrize("name", NON_CAUSAL)
def test_context_free_rows_equal_their_non_causal_reference(report, name):
    case = _case(report, name)
    assert case["configuration"]["causal"] is False
    plugin = case["plugin"]
    context_free = [r for r in plugin["rows"] if not r["context"]]
    assert context_free
    for row in context_free:
        assert not row["nan"] and row["error"] <= case["tolerance"], row


@pytest.mark.parametrize("name", NON_CAUSAL)
def test_the_plugin_is_stock_on_a_non_causal_batch(report, name):
    """Same regions, same output on every row: never worse than stock, row by row."""
    case = _case(report, name)
    assert case["plugin"]["regions"] == case["stock"]["regions"]
    assert case["plugin"]["rows"] == case["stock"]["rows"]


@pytest.mark.parametrize("name", NON_CAUSAL)
def test_control_the_reference_is_non_causal(report, name):
    """Control: a prompt of more than one token run causally is not its non-causal reference, so
    the judgement above can fail. Stock's rows with context are wrong (upstream's limits)."""
    case = _case(report, name)
    stock = case["stock"]
    wrong = {r["req_id"] for r in stock["rows"] if r["nan"] or r["error"] > case["tolerance"]}
    assert wrong == {r["req_id"] for r in stock["rows"] if r["context"] and r["query"] > 1}
