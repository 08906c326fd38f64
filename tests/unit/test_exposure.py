"""The exposure count in a process of its own (its totals start at zero there): once per step,
never during a capture, said at vLLM's stats cadence and written for ``/metrics`` with the same
totals, which the stat logger adds there (``metrics.ExposureStatLogger``)."""

from __future__ import annotations

import json
import os
import textwrap

from tests.helpers.subprocess_util import run_child

SETUP = """
import logging, os, tempfile, time
os.environ["VLLM_LOG_STATS_INTERVAL"] = "0.5"
os.environ["VLLM_ROCM_AITER_PLUGIN_EXPOSURE_DIR"] = tempfile.mkdtemp()
from vllm_rocm_aiter_plugin import exposure, split
from vllm_rocm_aiter_plugin.diagnostics import samples
said = []
class Said(logging.Handler):
    def emit(self, record):
        said.append((record.levelname, record.getMessage()))
from vllm_rocm_aiter_plugin.log import logger
logger().addHandler(Said())  # after vLLM configured its logging (at import up to 0.29)
step = split.split_batch(samples.make_batch([1, 50, 800], [901, 50, 8992]), 1)
later = split.split_batch(samples.make_batch([1, 50, 800], [902, 50, 9792]), 1)
"""


def test_a_step_is_counted_once_said_once_per_interval_and_written_for_metrics():
    done = run_child(
        SETUP
        + textwrap.dedent("""
        exposure.record(step, False)
        exposure.record(step, False)  # the same step built for another KV-cache group
        with exposure.not_counted():  # a CUDA graph's capture
            exposure.record(later, False)
        first, said_first = exposure.totals(), list(said)
        exposure.record(later, False)  # a new step within the interval: said at its end
        time.sleep(1.5)
        report({"first": first, "said_first": said_first, "then": exposure.totals(),
                "said": said, "file": open(exposure.channel_file(0)).read()})
        """)
    )
    result = done.result
    one = {"request_steps": 1, "steps": 1, "context_tokens": 8192, "observed": False}
    assert result["first"] == one
    both = {"request_steps": 2, "steps": 2, "context_tokens": 8192 + 8992, "observed": False}
    assert result["then"] == both
    assert json.loads(result["file"]) == both
    assert [level for level, _ in result["said_first"]] == ["INFO"]
    assert len(result["said"]) == 2, result["said"]
    level, line = result["said"][1]
    assert level == "INFO"
    assert "8992 cached tokens" in line and "Since start: 2 request-steps in 2 steps" in line


def test_observe_mode_says_it_at_warning_with_what_to_set():
    done = run_child(SETUP + "exposure.record(step, True)\nreport({'said': said})\n")
    ((level, line),) = done.result["said"]
    assert level == "WARNING"
    assert "as stock vLLM does (VLLM_ROCM_AITER_PLUGIN=observe)" in line
    assert "Unset VLLM_ROCM_AITER_PLUGIN" in line


def test_the_stat_logger_adds_what_the_counting_process_wrote():
    """What ``vllm serve``'s API server does at each step: the counters gain the new counts, in
    vLLM's naming, once."""
    done = run_child(
        SETUP
        + textwrap.dedent("""
        from prometheus_client import REGISTRY
        from vllm_rocm_aiter_plugin.metrics import ExposureStatLogger
        config = samples.tiny_vllm_config()
        stat_logger = ExposureStatLogger(config, 0)
        labels = {"model_name": str(config.model_config.served_model_name), "engine": "0",
                  "mode": "fixed"}
        def value(name):
            return REGISTRY.get_sample_value(f"vllm:rocm_aiter_fa_{name}_total", labels)
        seen = []
        for built in (step, None, later):
            if built is not None:
                exposure.record(built, False)
                time.sleep(0.7)  # past the interval: the totals are written with the log line
            stat_logger.record(None, None)
            seen.append([value(n) for n in
                         ("exposed_request_steps", "exposed_steps", "unattended_context_tokens")])
        report(seen)
        """)
    )
    assert done.result == [[1, 1, 8192], [1, 1, 8192], [2, 2, 8192 + 8992]]


COUNTING_PROCESS = """
import logging, os
os.environ["VLLM_LOG_STATS_INTERVAL"] = "60"  # the second step's line is pending at exit
from vllm_rocm_aiter_plugin import exposure, split
from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.log import logger
class Said(logging.Handler):
    def emit(self, record):
        print(PROCESS, record.getMessage(), flush=True)
logger().addHandler(Said())
logger().setLevel(logging.INFO)  # a spawned process starts with the root logger's WARNING
for seq_lens in ([901, 50, 8992], [902, 50, 9792]):
    exposure.record(split.split_batch(samples.make_batch([1, 50, 800], seq_lens), 1), False)
"""


def test_a_process_says_its_last_intervals_counts_when_it_exits():
    """A short job's last steps are in its totals: the line pending at exit is said then, by the
    process itself and by a forked or spawned child (how vLLM starts its engine and workers)."""
    done = run_child(
        textwrap.dedent(f"""
        import multiprocessing
        code = {COUNTING_PROCESS!r}
        for method in ("fork", "spawn"):
            context = multiprocessing.get_context(method)
            process = context.Process(target=exec, args=(code, {{"PROCESS": method}}))
            process.start()
            process.join()
        exec(code, {{"PROCESS": "main"}})
        report({{}})
        """)
    )
    for process in ("fork", "spawn", "main"):
        said = [line for line in done.output.splitlines() if line.startswith(process + " ")]
        assert len(said) == 2, (process, done.output[-3000:])
        assert "8992 cached tokens" in said[1], said
        assert "Since start: 2 request-steps in 2 steps, 17184 cached tokens" in said[1], said


def test_the_first_process_names_a_folder_for_its_children_and_removes_it_at_exit():
    done = run_child(
        textwrap.dedent("""
        import os
        os.environ.pop("VLLM_ROCM_AITER_PLUGIN_EXPOSURE_DIR", None)
        from vllm_rocm_aiter_plugin import exposure
        exposure.open_channel()
        folder = os.environ["VLLM_ROCM_AITER_PLUGIN_EXPOSURE_DIR"]
        exposure.open_channel()  # a second load (a child's) keeps it
        report({"folder": folder, "kept": os.environ["VLLM_ROCM_AITER_PLUGIN_EXPOSURE_DIR"],
                "there": os.path.isdir(folder)})
        """)
    )
    folder = done.result["folder"]
    assert done.result["kept"] == folder and done.result["there"]
    assert not os.path.exists(folder)


def test_without_a_writable_temporary_folder_the_plugin_still_loads():
    """No folder for ``/metrics``: a WARNING, no channel, and nothing raised into vLLM's start."""
    done = run_child(
        textwrap.dedent("""
        import os, tempfile
        os.environ.pop("VLLM_ROCM_AITER_PLUGIN_EXPOSURE_DIR", None)
        tempfile.tempdir = "/nonexistent/folder"
        from vllm_rocm_aiter_plugin import exposure
        exposure.open_channel()
        report({"channel": os.environ.get("VLLM_ROCM_AITER_PLUGIN_EXPOSURE_DIR")})
        """)
    )
    assert done.result == {"channel": None}
