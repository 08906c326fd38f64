"""The doctor's fresh-process checks on a busy machine: their time limits stretch with the load,
and a child that still runs past its limit gives an error saying a rerun may pass (the doctor
names it under CHECK FAILED, exit 2). Standard library only: no torch, no vLLM."""

from __future__ import annotations

import os
import sys

import pytest

from vllm_rocm_aiter_plugin.diagnostics import probe

pytestmark = [pytest.mark.cpu, pytest.mark.novllm]


@pytest.mark.parametrize("load, cores, expected", [(0.5, 2, 300), (2.0, 2, 300), (8.0, 2, 1200)])
def test_time_limits_stretch_with_the_load(monkeypatch, load, cores, expected):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert probe.load_scaled(300) == expected


def test_without_a_load_average_the_limit_is_as_given(monkeypatch):
    def unavailable():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert probe.load_scaled(300) == 300


def test_a_child_past_its_limit_says_a_rerun_may_pass():
    with pytest.raises(TimeoutError, match=r"did not finish within .* a rerun may pass"):
        probe.run_process(
            [sys.executable, "-c", "import time; time.sleep(60)"], env=os.environ, cwd=None,
            timeout=0.3,
        )  # fmt: skip
