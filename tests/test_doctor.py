"""``vllm-rocm-aiter-plugin doctor --json`` in fresh processes: keys, verdicts and exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllm.v1.attention.backends import utils as stock_utils
from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

import vllm_rocm_aiter_plugin
from tests.helpers import environment, forward_child, vllm_releases
from tests.helpers.doctor_answers import healthy_in_process_checks, passing_fresh_process_checks
from tests.helpers.subprocess_util import CLEARED, REPO_ROOT, run_child, scrubbed_env
from vllm_rocm_aiter_plugin import policy
from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder
from vllm_rocm_aiter_plugin.diagnostics import doctor, probe
from vllm_rocm_aiter_plugin.diagnostics.forward import harness, reference_kernels, runner
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
    DOCTOR_SHUFFLE_DECODE_CASE,
    DOCTOR_SINK_CASE,
)

pytestmark = [pytest.mark.cpu, pytest.mark.subprocess]

TOP_LEVEL_KEYS = {
    "versions", "gpu", "aiter", "variables", "split", "plugins", "resolution", "forward",
    "check_errors", "policy", "problems", "notes", "verdict", "exit_code",
}  # fmt: skip


def _build_calling_split_as_attribute(
    self, common_prefix_len, common_attn_metadata, fast_build=False
):
    stock_utils.split_decodes_prefills_and_extends(
        common_attn_metadata, decode_threshold=self.reorder_batch_threshold
    )
    return AiterFlashAttentionMetadataBuilder.build(
        self, common_prefix_len, common_attn_metadata, fast_build
    )


def _doctor(env_extra: dict[str, str], *args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_rocm_aiter_plugin", "doctor", "--json", *args],
        cwd=REPO_ROOT, env=scrubbed_env(env_extra), capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)  # stdout is the JSON document, nothing else


def test_default_install_reports_fix_active():
    """On any image: releases from the oldest tested on (newer ones with a WARNING) get the fix; on an
    older one the report carries the policy's refusal, and stock's harm decides the exit code."""
    code, report = _doctor({"VLLM_ROCM_USE_AITER": "1"})
    assert set(report) == TOP_LEVEL_KEYS
    assert report["check_errors"] == {}
    if not environment.plugin_overrides_by_default():
        assert code == report["exit_code"] == 1  # the refusal is a PROBLEM line
        assert report["resolution"]["resolves_to_plugin"] is False
        assert report["policy"]["overrides_rocm_aiter_fa"] is False
        assert report["policy"]["level"] == "WARNING"
        assert report["problems"] == [report["policy"]["message"]]
        assert "VLLM_ROCM_AITER_PLUGIN=force" in report["policy"]["message"]
        return
    assert code == report["exit_code"] == 0
    assert report["policy"]["overrides_rocm_aiter_fa"] is True
    assert report["policy"]["level"] == (
        "INFO" if environment.vllm_in_tested_range() else "WARNING"
    )
    # Newer than tested: the policy's WARNING is a note (the checks ran on this vLLM); no problem.
    assert report["problems"] == []
    policy_notes = [n for n in report["notes"] if n.startswith(report["policy"]["message"])]
    assert len(policy_notes) == (0 if environment.vllm_in_tested_range() else 1)
    assert report["verdict"].startswith("fix ACTIVE")
    assert report["split"]["stock_split_affected"] is vllm_releases.installed_is_affected()
    drops = vllm_releases.installed_drops_context_in_v2_order()
    assert report["split"]["stock_split_drops_context_v2_order"] is drops
    assert report["resolution"]["resolves_to_plugin"] is True
    assert report["resolution"]["overridden_by_other"] is None
    assert report["plugins"]["general_entry_point"] and report["plugins"]["platform_entry_point"]
    assert report["versions"]["vllm"].startswith(vllm_releases.release())
    assert report["versions"]["vllm_in_tested_range"] is environment.vllm_in_tested_range()
    assert (report["gpu"] is None) is not environment.gpu_visible()
    if report["gpu"] is not None:
        assert report["gpu"]["rocm"] is environment.rocm_torch()
    assert report["aiter"]["importable"] is environment.aiter_importable()
    variables = {v["name"]: v for v in report["variables"]}
    assert variables["VLLM_ROCM_USE_AITER"]["value"] == "1"
    assert all(v["problem"] is None for v in report["variables"])
    assert all(case["ok"] for case in report["resolution"]["behaviour"].values())
    forward = report["forward"]
    assert forward["registered_right"] is True
    assert bool(forward["stock_wrong_requests"]) is drops
    if forward["v1_order_absent"] is None:  # a release with the V1 runner to compare with
        assert forward["chunks"] <= forward["v1_stock_chunks"]
    else:
        assert forward["v1_stock_chunks"] is None
    assert forward["vllm_counts_sink_once"] == vllm_releases.installed_counts_sink_once()
    # Where this release takes attention sinks, a step with sinks is judged too.
    assert (f"{DOCTOR_SINK_CASE}:" in forward["registered_detail"]) is runner.takes_sinks()
    assert forward["configuration"]["kv_cache_dtype"] == "auto"  # the check's own, named
    assert (forward["configuration"]["block_size"], forward["configuration"]["head_size"]) == (
        16,
        64,
    )
    # Notes say what this machine cannot run; they never change the verdict.
    can_run = environment.rocm_gpu() and environment.aiter_importable()
    assert any("cannot run ROCM_AITER_FA" in note for note in report["notes"]) is not can_run


@pytest.mark.parametrize(
    "env, problem",
    [
        ({"VLLM_PLUGINS": "something_else"}, "VLLM_PLUGINS='something_else' excludes the plugin"),
        ({"VLLM_ROCM_AITER_PLUGIN": "0"}, "VLLM_ROCM_AITER_PLUGIN disables the plugin"),
    ],
    ids=["VLLM_PLUGINS", "kill-switch"],
)
def test_disabled_plugin(env, problem):
    code, report = _doctor(env)
    assert report["resolution"]["resolves_to_plugin"] is False
    assert any(p.startswith(problem) for p in report["problems"]), report["problems"]
    assert code == report["exit_code"] == 1  # a PROBLEM line, whatever this vLLM needs
    if vllm_releases.installed_is_affected() or vllm_releases.installed_drops_context_in_v2_order():
        assert report["verdict"].startswith("AFFECTED and the fix is NOT active")
        assert ("model-runner V2 steps can lose context" in report["verdict"]) is (
            vllm_releases.installed_drops_context_in_v2_order()
        )
    else:
        assert report["verdict"].startswith("fix not needed")
        assert report["verdict"].endswith("PROBLEM line above to fix")


def _broken() -> None:
    raise OSError("hipErrorNoDevice: no access")


@pytest.mark.parametrize("check", [*doctor.IN_PROCESS, *doctor.FRESH_PROCESS])
def test_every_check_that_cannot_run_gives_exit_code_2_and_is_named(check, monkeypatch):
    """Whichever check fails (a HIP error from the GPU query, say), the doctor exits 2, names it,
    and still reports what the other checks found."""
    monkeypatch.setenv("VLLM_ROCM_AITER_PLUGIN", "garbage")  # found by the variables check
    overridden = doctor.Resolution("other.Backend", "b", False, "other.Backend", True, {})
    checks = {**passing_fresh_process_checks(), "resolution": lambda: overridden}
    report = doctor.collect({**checks, check: _broken})
    assert report.exit_code == 2
    assert report.check_errors == {check: "OSError: hipErrorNoDevice: no access"}
    assert report.verdict.startswith(f"doctor could not run: {check}")
    assert getattr(report, check) in (None, [])
    found = {
        "variables": "VLLM_ROCM_AITER_PLUGIN='garbage' is not understood",
        "resolution": "ROCM_AITER_FA is overridden by other.Backend",
    }
    for source, problem in found.items():
        if source != check:  # what the checks that did run found is still reported
            assert any(problem in p for p in report.problems), (source, report.problems)


def test_fresh_process_checks_import_nothing_in_their_threads():
    """The checks that start child processes run in threads beside the in-process checks; a
    thread importing vLLM's modules while the main thread does can deadlock (vLLM 0.24.0:
    _DeadlockError, and the doctor exits 2), so the threads import nothing. Child processes are
    refused here: the checks run up to starting one."""
    child = run_child(
        """
        import subprocess, sys, threading
        from unittest import mock
        from vllm_rocm_aiter_plugin.diagnostics import doctor

        in_threads = []
        def record(event, args):
            if event == "import" and threading.current_thread() is not threading.main_thread():
                in_threads.append(args[0])
        sys.addaudithook(record)
        def no_child(*args, **kwargs):
            raise OSError("no child processes in this test")
        with mock.patch.object(subprocess, "run", no_child):
            checks = doctor.collect()
        report({"in_threads": in_threads, "errors": checks.check_errors})
        """
    )
    for name in doctor.FRESH_PROCESS:  # each got as far as starting its child
        assert "no child processes in this test" in child.result["errors"][name]
    assert child.result["in_threads"] == []


def test_vllm_plugins_entries_are_not_stripped(tmp_path):
    """vLLM splits VLLM_PLUGINS at commas without stripping: with a blank before the name it
    loads stock, and the doctor says so and why."""
    code, report = _doctor({"VLLM_PLUGINS": "foo, vllm_rocm_aiter_plugin"})
    variable = next(v for v in report["variables"] if v["name"] == "VLLM_PLUGINS")
    assert variable["value"] == "foo, vllm_rocm_aiter_plugin"
    assert variable["meaning"] == "vLLM does not load the plugin"
    assert report["resolution"]["resolves_to_plugin"] is False
    assert any(
        "VLLM_PLUGINS='foo, vllm_rocm_aiter_plugin' excludes" in p for p in report["problems"]
    )
    assert code == report["exit_code"] == 1


class _AttributeSplitBuilder(PluginAiterFlashAttentionMetadataBuilder):
    """The plugin's builder on a (hypothetical) vLLM whose build() calls the split as an
    attribute: the split cannot be rebound, so vLLM's stock split runs."""

    vllm_build = staticmethod(_build_calling_split_as_attribute)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.uses_own_build = False


def test_verdict_comes_from_building_batches_not_from_resolution():
    """ROCM_AITER_FA resolves to the plugin, but its builder runs stock's split: NOT active."""
    behaviour = probe.check_builder_behaviour(_AttributeSplitBuilder)
    assert behaviour["v2_order"]["ok"] is not vllm_releases.installed_drops_context_in_v2_order()
    assert behaviour["eagle_pure_decode"]["ok"] is not vllm_releases.installed_is_affected()
    resolved = {
        "path": policy.BACKEND_QUALNAME,
        "stock": "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend",
        "builder": "tests._AttributeSplitBuilder",
        "behaviour": behaviour,
    }
    forward = passing_fresh_process_checks()["forward"]
    report = doctor.collect(
        {"resolution": lambda: doctor.resolution_report(resolved), "forward": forward}
    )
    assert report.resolution.resolves_to_plugin is True
    harmed = vllm_releases.installed_is_affected() or (
        vllm_releases.installed_drops_context_in_v2_order()
    )
    if harmed:
        assert report.exit_code == 1
        assert report.verdict.startswith("fix NOT working")
        assert any("does not build right" in p for p in report.problems)
    else:
        assert report.exit_code == 0


def test_verdict_comes_from_the_attention_output_too():
    """Builder checks pass, but the registered backend's output on the forward step is wrong:
    NOT working, and the problem says where."""
    checks = passing_fresh_process_checks()
    wrong = doctor.Forward("doctor-step", "cpu", "k", True, False, "3 requests off", ["a"], 2, 2)
    report = doctor.collect({**checks, "forward": lambda: wrong})
    assert report.exit_code == 1 and report.verdict.startswith("fix NOT working")
    assert any("attention output on the doctor-step step is wrong" in p for p in report.problems)


def test_a_kernel_that_drops_the_sink_on_the_new_token_call_makes_the_doctor_say_not_working():
    """The doctor's own forward steps, with AITER's varlen kernel dropping the sink on causal
    calls (a CK that sets the sink to -inf under a mask, built without AITER's compensation:
    docs/upstream/aiter.md): the sink step is wrong, and the verdict says fix NOT working."""
    if not runner.takes_sinks():
        pytest.skip("this release's ROCM_AITER_FA takes no attention sinks: no sink step")
    if reference_kernels.aiter_available():
        pytest.skip("AITER's real kernels run here: tests/rocm/test_aiter_assumptions.py asks them")
    if not environment.plugin_overrides_by_default():
        pytest.skip("the policy leaves this vLLM stock: the forward check judges stock")
    (sink_step,) = [c for c in doctor.forward_cases(None, "cpu") if c.name == DOCTOR_SINK_CASE]
    report = forward_child.run_in_child(
        kinds=("stock", "registered"), cases=[sink_step],
        mutations=["reference-drops-sink-on-causal-calls"],
    )  # fmt: skip
    if "unavailable" in report:  # a CUDA or ROCm platform: the CPU forward cannot run here
        pytest.skip(report["unavailable"])
    forward = doctor.forward_report(report)
    assert forward.case == DOCTOR_SINK_CASE
    assert not forward.registered_right, forward.registered_detail
    verdict = doctor.collect({**passing_fresh_process_checks(), "forward": lambda: forward})
    assert verdict.exit_code == 1 and verdict.verdict.startswith("fix NOT working")


@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"], ids=["closed", "full"])
def test_unwritable_stdout_exits_2_with_one_line(redirect):
    proc = subprocess.run(
        f"{sys.executable} -m vllm_rocm_aiter_plugin doctor --json {redirect}",
        shell=True, cwd=REPO_ROOT, env=scrubbed_env(), capture_output=True, text=True,
        timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("vllm-rocm-aiter-plugin:")]
    assert len(ours) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_help_lists_each_command_once_and_the_exit_codes():
    proc = _cli("--help")
    assert proc.returncode == 0
    for command in ("demo", "doctor"):
        assert len(re.findall(rf"^\s+{command}\s", proc.stdout, re.M)) == 1, proc.stdout
    assert "--json" in proc.stdout and "exit codes:" in proc.stdout
    for code in ("0", "1", "2"):
        assert f"\n  {code}  " in proc.stdout


def test_the_doctor_checks_the_operators_serving_configuration():
    """``--kv-cache-dtype fp8 --block-size 32 --head-size 128``: the forward check runs in that
    configuration (fp8 in this device's format, scales that are not 1) and the JSON names it."""
    if not environment.plugin_overrides_by_default():
        pytest.skip("the policy leaves this vLLM stock: the forward check judges stock")
    code, report = _doctor(
        {"VLLM_ROCM_USE_AITER": "1"},
        "--kv-cache-dtype", "fp8", "--block-size", "32", "--head-size", "128",
    )  # fmt: skip
    assert report["check_errors"] == {}
    forward = report["forward"]
    configuration = forward["configuration"]
    assert (configuration["kv_cache_dtype"], configuration["block_size"]) == ("fp8", 32)
    assert configuration["head_size"] == 128
    assert configuration["fp8_format"] == environment.fp8_format_of_forward_device()
    assert configuration["k_scale"] != 1.0 and configuration["v_scale"] != 1.0
    assert forward["registered_right"] is True, forward["registered_detail"]
    assert code == report["exit_code"] == 0


def test_the_forward_check_runs_in_the_shuffle_layout_the_operator_set():
    """``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1``, as vLLM reads it: the forward check runs its first
    step in that layout where the release's layout can run right; where it cannot, the check says
    why and exits 2; where the release has no such layout, the variable changes nothing."""
    if not environment.plugin_overrides_by_default():
        pytest.skip("the policy leaves this vLLM stock: the forward check judges stock")
    code, report = _doctor({"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"})
    unavailable = harness.shuffle_layout_unavailable()
    if unavailable is not None and unavailable != harness.NO_SHUFFLE_LAYOUT:
        assert unavailable in report["check_errors"]["forward"]
        assert code == report["exit_code"] == 2
        return
    assert report["check_errors"] == {}
    forward = report["forward"]
    layout = "NHD" if unavailable else "SHUFFLE"
    assert forward["configuration"]["kv_cache_layout"] == layout
    assert forward["registered_right"] is True, forward["registered_detail"]
    assert ("eagle" in forward["registered_detail"]) is (layout == "NHD")
    assert (f"{DOCTOR_SHUFFLE_DECODE_CASE}:" in forward["registered_detail"]) is (layout != "NHD")
    assert code == report["exit_code"] == 0


def test_doctor_help_names_the_serving_configuration_options():
    proc = _cli("doctor", "--help")
    assert proc.returncode == 0
    for option in ("--kv-cache-dtype", "--block-size", "--head-size"):
        assert option in proc.stdout
    assert "vllm serve" in proc.stdout


def test_bad_doctor_option_shows_the_doctors_usage():
    proc = _cli("doctor", "--bogus")
    assert proc.returncode == 2
    assert "usage: vllm-rocm-aiter-plugin doctor [-h] [--json]" in proc.stderr
    assert "unrecognized arguments: --bogus" in proc.stderr


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vllm_rocm_aiter_plugin", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize(
    "value, meaning",
    [
        ("bogus", "unknown name: automatic selection"),
        ("XFORMERS", "legacy name with no ROCm backend: automatic selection"),
        ("ROCM_FLASH", "legacy name for ROCM_ATTN"),
    ],
)
def test_doctor_says_what_vllm_attention_backend_selects(value, meaning):
    code, report = _doctor({"VLLM_ATTENTION_BACKEND": value})
    variable = next(v for v in report["variables"] if v["name"] == "VLLM_ATTENTION_BACKEND")
    assert variable["value"] == value and variable["meaning"].startswith(meaning)
    problem = variable["problem"]
    assert (problem is not None) is (value != "ROCM_FLASH")
    if problem:
        assert problem in report["problems"]
    assert code == report["exit_code"] == (0 if problem is None else 1)


PROBLEM_KINDS = {
    # kind: (variables to set, checks answered otherwise, words of the PROBLEM line); a table,
    # whose rows are alike in shape only (duplicates reports neighbouring rows as a pair)
    "switch not understood": ({"VLLM_ROCM_AITER_PLUGIN": "bogus"}, {},
                              "VLLM_ROCM_AITER_PLUGIN='bogus' is not understood"),
    "fast build not understood": ({"VLLM_ROCM_AITER_PLUGIN_FAST_BUILD": "sometimes"}, {},
                                  "VLLM_ROCM_AITER_PLUGIN_FAST_BUILD='sometimes' is not understood"),
    "attention backend unknown": ({"VLLM_ATTENTION_BACKEND": "NOPE"}, {},
                                  "VLLM_ATTENTION_BACKEND='NOPE' is not an attention backend"),
    "attention backend ROCm refuses": ({"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}, {},
                                       "VLLM_ATTENTION_BACKEND=FLASH_ATTN will not be honoured"),
    "CPU backend named": ({"VLLM_ATTENTION_BACKEND": "CPU_ATTN"}, {},
                          "VLLM_ATTENTION_BACKEND=CPU_ATTN will not be honoured"),
    "VLLM_PLUGINS excludes the plugin": ({"VLLM_PLUGINS": "other"}, {},
                                         "VLLM_PLUGINS='other' excludes the plugin"),
    "switched off": ({"VLLM_ROCM_AITER_PLUGIN": "0"}, {},
                     "VLLM_ROCM_AITER_PLUGIN disables the plugin"),
    "entry point missing": ({}, {"plugins": doctor.Plugins("x", False, True, [])},
                            "the vllm.general_plugins entry point is missing"),
    "another platform plugin": ({}, {"plugins": doctor.Plugins("x", True, True, ["other"])},
                                "other out-of-tree platform plugins are installed (other)"),
    "overridden by another package": (
        {}, {"resolution": doctor.Resolution("o.B", "b", False, "o.B", True, {})},
        "ROCM_AITER_FA is overridden by o.B"),
    "builder wrong": (
        {}, {"resolution": doctor.Resolution(policy.BACKEND_QUALNAME, "b", True, None, False,
                                             {"v2_order": {"ok": False, "detail": "lost"}})},
        "its builder does not build right on this vLLM (v2_order: lost)"),
    "attention output wrong": (
        {}, {"forward": doctor.Forward("c", "cpu", "k", False, False, "off", [], 1, 1)},
        "the plugin's attention output on the c step is wrong"),
    "release refused by the policy": (
        {}, {"policy": doctor.Policy(False, "WARNING", "vLLM 0.1.0 is older than 0.20.0"),
             "resolution": doctor.Resolution("stock.B", "b", False, None, True, {})},
        "vLLM 0.1.0 is older than 0.20.0"),
    "not resolving, no cause found": (
        {}, {"resolution": doctor.Resolution("stock.B", "b", False, None, True, {})},
        "ROCM_AITER_FA does not resolve to the plugin in a fresh vLLM process"),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(PROBLEM_KINDS))
def test_every_kind_of_problem_gives_exit_1_and_one_problem_line(kind, monkeypatch, capsys):
    """A CI health check exists to catch a misconfiguration: each PROBLEM the doctor can report
    makes it exit 1, whatever else holds, and is printed as one PROBLEM line."""
    env, checks, words = PROBLEM_KINDS[kind]
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    answers = {name: (lambda value=value: value) for name, value in checks.items()}
    report = doctor.collect({**healthy_in_process_checks(), **answers})
    assert report.check_errors == {}
    assert report.exit_code == 1, (report.verdict, report.problems)
    assert [p for p in report.problems if words in p], report.problems
    doctor.render(report, sys.stdout)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("PROBLEM")]
    assert len(printed) == len(report.problems)


def test_a_refused_backend_names_the_backends_rocm_offers(monkeypatch):
    """The PROBLEM for a backend ROCm never offers names what vLLM's ROCm selection offers
    instead (off ROCm: every kind of layer's candidates, read off the installed vLLM; on ROCm:
    what stock offers a decoder layer here), and the variable's line no longer says that it
    selects the backend."""
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASH_ATTN")
    report = doctor.collect(healthy_in_process_checks())
    (problem,) = report.problems
    assert problem.startswith("VLLM_ATTENTION_BACKEND=FLASH_ATTN will not be honoured")
    assert "ROCM_ATTN" in problem
    variable = next(v for v in report.variables if v.name == "VLLM_ATTENTION_BACKEND")
    assert "not honoured" in variable.meaning or "never offers" in variable.meaning
    assert report.exit_code == 1


@pytest.mark.parametrize("name", ["ROCM_AITER_FA", "TRITON_MLA"])
def test_a_backend_rocm_offers_for_some_layers(monkeypatch, name):
    """Off ROCm the variable is not read: a name vLLM's ROCm selection offers for some layer is a
    NOTE saying so, not a PROBLEM. On a ROCm GPU the verdict is the selection's own on this GPU
    (``tests/test_backend_selection.py`` holds the two together): the report carries exactly it."""
    from vllm.platforms import current_platform

    from vllm_rocm_aiter_plugin.diagnostics.backend_choice import verdict_here

    for variable in CLEARED:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", name)
    report = doctor.collect(healthy_in_process_checks())
    verdict = verdict_here(name)
    if not current_platform.is_rocm():
        assert verdict.problem is None
        assert verdict.note.startswith(f"VLLM_ATTENTION_BACKEND={name}: not read on this machine")
    assert report.problems == ([verdict.problem] if verdict.problem else []), report.problems
    assert report.exit_code == (1 if verdict.problem else 0)
    assert verdict.note is None or verdict.note in report.notes


def test_an_unparsable_vllm_version_is_its_own_problem(monkeypatch):
    """A source build's vLLM reports ``dev`` (``vllm/version.py``'s fallback): the serving
    process stays stock, and the doctor's policy line and PROBLEM say why and how to take the fix
    anyway, from the version the plugin's policy reads (``vllm.__version__``, not the package
    metadata's)."""
    import vllm

    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(vllm, "__version__", "dev")  # what a source build without _version has
    stock = doctor.Resolution("stock.B", "b", False, None, True, {})
    plugins = doctor.Plugins("site-packages", True, True, [])
    checks = {**passing_fresh_process_checks(), "resolution": lambda: stock}
    report = doctor.collect({**checks, "plugins": lambda: plugins})
    assert report.versions is not None and report.versions.vllm == "dev"
    assert report.versions.vllm_in_tested_range is False
    assert report.policy is not None and "'dev', which cannot be parsed" in report.policy.message
    (problem,) = report.problems
    assert "VLLM_ROCM_AITER_PLUGIN=force to take the fix anyway" in problem
    assert report.exit_code == 1


def test_a_healthy_install_has_no_problem_and_exits_0(monkeypatch):
    """Control for the cases above: the same answers without a planted problem."""
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    report = doctor.collect(healthy_in_process_checks())
    assert (report.problems, report.exit_code) == ([], 0), report.problems
    assert report.verdict.startswith("fix ACTIVE")


def test_entry_points_come_from_the_installed_distribution_not_a_stale_egg_info(
    tmp_path, monkeypatch
):
    """A checkout's leftover ``*.egg-info`` (on sys.path as the current directory) claims other
    entry points; the doctor reads the distribution pip installed."""
    stale = tmp_path / "vllm_rocm_aiter_plugin.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: vllm-rocm-aiter-plugin\n")
    (stale / "entry_points.txt").write_text("[console_scripts]\nstale = stale:main\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = doctor.check_plugins()
    assert plugins.general_entry_point and plugins.platform_entry_point
    assert not plugins.distribution.startswith(str(tmp_path))


def test_the_cli_without_vllm_or_torch_exits_2_with_one_line(tmp_path):
    """The installed package run by a Python that has neither vLLM nor torch (no site-packages:
    only the package itself is on its path)."""
    (tmp_path / "vllm_rocm_aiter_plugin").symlink_to(Path(vllm_rocm_aiter_plugin.__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "vllm_rocm_aiter_plugin", "doctor"],
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]},
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("vllm-rocm-aiter-plugin: torch and vllm not installed in this Python")


def test_the_doctor_prints_no_vllm_log_line_that_contradicts_it():
    """vLLM's records are summed up on stderr before the report (no INFO line saying Triton is
    missing beside a forward check that runs vLLM's Triton kernels); the verdict is the last line
    on stdout."""
    from tests.test_demo import LOG_LINE
    from vllm_rocm_aiter_plugin.diagnostics import vllm_log

    proc = subprocess.run(
        [sys.executable, "-m", "vllm_rocm_aiter_plugin", "doctor"],
        cwd=REPO_ROOT, env=scrubbed_env(), capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert not LOG_LINE.search(proc.stderr), proc.stderr
    for banned in ("Triton not installed or not compatible", "0 active driver(s)"):
        assert banned not in proc.stderr
    if "WARNING Model Runner V2 requires Triton" in proc.stderr:
        assert f"why here: {vllm_log.why('Model Runner V2 requires Triton')}" in proc.stderr
    last = proc.stdout.rstrip().splitlines()[-1]
    assert last.startswith(("fix ACTIVE", "fix not needed", "AFFECTED", "fix NOT")), last
