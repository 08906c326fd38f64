"""The commands' child protocol (``diagnostics.child``): a fresh process's result is its last
marked line, its time limit stretches with the machine's load, and a child past its limit is
stopped with an error saying a rerun may pass (the doctor names it under CHECK FAILED, exit 2).
Standard library only: no torch, no vLLM."""

from __future__ import annotations

import os

import pytest

from vllm_rocm_aiter_plugin.diagnostics import child

pytestmark = pytest.mark.novllm


@pytest.mark.parametrize("load, cores, expected", [(0.5, 2, 300), (2.0, 2, 300), (8.0, 2, 1200)])
def test_time_limits_stretch_with_the_load(monkeypatch, load, cores, expected):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert child.load_scaled(300) == expected


def test_without_a_load_average_the_limit_is_as_given(monkeypatch):
    def unavailable():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert child.load_scaled(300) == 300


def test_a_child_past_its_limit_says_a_rerun_may_pass():
    with pytest.raises(TimeoutError, match=r"did not finish within .* a rerun may pass"):
        child.run(["-c", "import time; time.sleep(60)"], timeout=0.3)


def test_the_result_is_the_last_marked_line_and_the_request_arrives_on_stdin():
    code = (
        "from vllm_rocm_aiter_plugin.diagnostics.child import read_request, report\n"
        "request = read_request()\n"
        "print('@@ not a result'); report({'seen': request}); report({'last': request['n'] + 1})\n"
    )
    done = child.run(["-c", code], request={"n": 41}, env={"UNRELATED": None})
    assert done.returncode == 0, done.output
    assert done.result == {"last": 42}
    assert child.run(["-c", "print('nothing marked')"]).result is None
