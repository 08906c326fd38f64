"""The release facts ``docs/testing.md``'s coverage matrix reads (``releases.py``) hold on the
installed release (the matrix's generation: ``tests/project/test_docs.py``)."""

from __future__ import annotations

import pytest
import vllm

from tests.helpers import vllm_releases
from vllm_rocm_aiter_plugin import releases
from vllm_rocm_aiter_plugin.diagnostics import model_runner
from vllm_rocm_aiter_plugin.diagnostics.forward import harness, runner


def test_the_non_causal_fact_holds_on_the_installed_release():
    if vllm.__version__ not in releases.CI:
        pytest.skip(f"vLLM {vllm.__version__} is not a CI release; the fact covers those only")
    builds = runner.builds_non_causal_batches()
    assert (vllm.__version__ in releases.NON_CAUSAL_V2_BATCHES) == builds


def test_the_shuffle_layout_fact_holds_on_the_installed_release():
    if vllm.__version__ not in releases.CI:
        pytest.skip(f"vLLM {vllm.__version__} is not a CI release; the fact covers those only")
    runs = harness.shuffle_layout_unavailable() is None
    assert (vllm.__version__ in releases.SHUFFLE_LAYOUT_RUNS) == runs


def test_the_sinks_fact_holds_on_the_installed_release():
    if vllm.__version__ not in releases.CI:
        pytest.skip(f"vLLM {vllm.__version__} is not a CI release; the fact covers those only")
    assert (vllm.__version__ in releases.SINKS) == harness.takes_sinks()


def test_the_sink_counted_once_fact_holds_on_the_installed_release():
    """vLLM's own extend path, run: it counts a sink once exactly on the releases read so."""
    if vllm.__version__ not in releases.CI:
        pytest.skip(f"vLLM {vllm.__version__} is not a CI release; the fact covers those only")
    counted_once = vllm.__version__ in releases.SINK_COUNTED_ONCE_UPSTREAM
    assert vllm_releases.installed_counts_sink_once() == counted_once


def test_the_v1_runner_fact_holds_on_the_installed_release():
    if vllm.__version__ not in releases.CI:
        pytest.skip(f"vLLM {vllm.__version__} is not a CI release; the fact covers those only")
    removed = vllm.__version__ in releases.V1_RUNNER_REMOVED
    assert (model_runner.why_no_v1_order() is not None) == removed
