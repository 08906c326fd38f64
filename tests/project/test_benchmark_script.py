"""The benchmark script runs and reports every column (it asserts no timing: benchmarks are not tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.subprocess_util import REPO_ROOT
from vllm_rocm_aiter_plugin import builder
from vllm_rocm_aiter_plugin.diagnostics import probe
from vllm_rocm_aiter_plugin.diagnostics.model_runner import why_no_v1_order


def test_benchmark_script_reports_both_sides(tmp_path):
    out = tmp_path / "bench.json"
    proc = _run_benchmark(
        "bench_builder.py",
        "--sizes",
        "1",
        "8",
        "--shapes",
        "pure-decode",
        "mixed",
        "extend-heavy",
        "--budget-s",
        "0.02",
        "--json",
        str(out),
    )
    report = json.loads(out.read_text())
    rows = {(r["shape"], r["requests"]): r for r in report["rows"]}
    # mixed needs 3 requests at least, so it has no row at size 1
    assert set(rows) == {
        ("pure-decode", 1),
        ("pure-decode", 8),
        ("mixed", 8),
        ("extend-heavy", 1),
        ("extend-heavy", 8),
    }
    affected = probe.probe_stock_split().affected
    own_path = builder.own_build_default()
    for (shape, n), row in rows.items():
        assert row["split_plugin_us"] > 0 and row["build_plugin_us"] > 0
        assert row["counting_us"] >= 0
        assert row["plugin_peak_bytes"] > 0
        if shape == "pure-decode" and affected:  # the bug: stock cannot build these batches
            assert row["split_stock_error"] == row["build_stock_error"] == "AssertionError"
            assert row["split_stock_us"] is None and row["build_stock_us"] is None
            assert f"| {shape} | {n} | {n} | raises AssertionError |" in proc.stdout
        else:
            assert row["split_stock_us"] > 0 and row["build_stock_us"] > 0
            assert row["stock_peak_bytes"] > 0
        if shape == "pure-decode":
            assert row["split_plugin_tensor_ops"] == 0
            if own_path and report["machine"]["pure_decode_reads_seq_lens"] is False:
                assert row["plugin_allocs"] == 0  # else the metadata holds sum(seq_lens)
    assert report["machine"]["own_build_path"] is own_path
    assert "| mixed | 8 |" in proc.stdout


def test_serving_trace_reports_stock_dropping_context_and_the_plugin_never(tmp_path):
    """vLLM's own Scheduler under load, steps in model-runner V2 order: stock drops context on
    some steps, the plugin on none, and V1 order on none (no timing asserted)."""
    out = tmp_path / "trace.json"
    proc = _run_benchmark(
        "serving_trace.py",
        "--steps",
        "100",
        "--workloads",
        "chunked-8192",
        "prefix-cache-heavy",
        "--forward-steps",
        "1",
        "--json",
        str(out),
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["workload"] for r in rows] == ["chunked-8192", "prefix-cache-heavy"]
    for row in rows:
        assert row["steps"] > 50 and row["mixed_steps"] > 0 and row["requests"] > 0
        assert row["plugin_steps"] == row["plugin_requests"] == 0
        # V1 order (where the release has that runner) is right for stock; absent, it says so
        assert row["v1_stock_steps"] == (0 if why_no_v1_order() is None else None)
        assert row["build_stock_s"] > 0 and row["build_plugin_s"] > 0
        assert row["stock_requests"] <= row["requests"]
    assert sum(r["stock_steps"] for r in rows) > 0  # the bug, on vLLM's own scheduling
    for row in rows:  # one mixed step each through vLLM's forward: the plugin is right there
        assert row["forward_steps"] == 1 and row["forward_requests"] > 0
        assert row["plugin_wrong"] == row["plugin_nan"] == 0
    assert "| prefix-cache-heavy | " in proc.stdout


def _run_benchmark(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, os.path.join("benchmarks", script), *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc
