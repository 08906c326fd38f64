"""The doctor's verdicts, problems and table in this process, each check answered as on a healthy
install but the one a test plants (``doctor.collect(overrides)``); its end-to-end runs are in
``tests/commands/test_doctor.py``."""

from __future__ import annotations

import dataclasses
import errno
import io
import sys

import pytest
from vllm.v1.attention.backends import utils as stock_utils
from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

from tests.helpers import doctor_answers
from tests.helpers.doctor_answers import healthy_in_process_checks, passing_fresh_process_checks
from tests.helpers.subprocess_util import CLEARED
from vllm_rocm_aiter_plugin import policy
from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder
from vllm_rocm_aiter_plugin.diagnostics import cli, doctor, doctor_output, probe


@pytest.fixture(autouse=True)
def _unset(monkeypatch):
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)


def _broken() -> None:
    raise OSError("hipErrorNoDevice: no access")


@pytest.mark.parametrize("check", [*doctor.IN_PROCESS, *doctor.FRESH_PROCESS])
def test_every_check_that_cannot_run_gives_exit_code_2_and_is_named(check, monkeypatch):
    """Whichever check fails (a HIP error from the GPU query, say), the doctor exits 2, names it,
    and still reports what the other checks found."""
    monkeypatch.setenv("VLLM_ROCM_AITER_PLUGIN", "garbage")  # found by the variables check
    other = doctor_answers.resolution("other.Backend")
    checks = {**passing_fresh_process_checks(), "resolution": lambda: other}
    report = doctor.collect({**checks, check: _broken})
    assert report.exit_code == 2
    assert report.check_errors == {check: "OSError: hipErrorNoDevice: no access"}
    assert report.verdict.startswith(f"doctor could not run: {check}")
    assert getattr(report, check) in (None, [], {})
    found = {
        "variables": "VLLM_ROCM_AITER_PLUGIN='garbage' is not understood",
        "resolution": "ROCM_AITER_FA is overridden by other.Backend",
    }
    for source, problem in found.items():
        if source != check:  # what the checks that did run found is still reported
            assert any(problem in p for p in report.problems), (source, report.problems)


def _build_calling_split_as_attribute(
    self, common_prefix_len, common_attn_metadata, fast_build=False
):
    stock_utils.split_decodes_prefills_and_extends(
        common_attn_metadata, decode_threshold=self.reorder_batch_threshold
    )
    return AiterFlashAttentionMetadataBuilder.build(
        self, common_prefix_len, common_attn_metadata, fast_build
    )


class _AttributeSplitBuilder(PluginAiterFlashAttentionMetadataBuilder):
    """The plugin's builder on a (hypothetical) vLLM whose build() calls the split as an
    attribute: the split cannot be rebound, so vLLM's stock split runs."""

    vllm_build = staticmethod(_build_calling_split_as_attribute)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, own_build=False, **kwargs)


def test_verdict_comes_from_building_batches_not_from_resolution():
    """ROCM_AITER_FA resolves to the plugin, but its builder runs stock's split: NOT active."""
    behaviour = probe.check_builder_behaviour(_AttributeSplitBuilder)
    assert behaviour["v2_order"]["ok"] is not probe.probe_stock_v2_order().affected
    assert behaviour["eagle_pure_decode"]["ok"] is not probe.probe_stock_split().affected
    resolved = doctor_answers.resolution()
    resolved.behaviour = behaviour
    report = doctor.collect({**passing_fresh_process_checks(), "resolution": lambda: resolved})
    assert doctor.resolves_to_plugin(report.resolution)
    harmed = probe.probe_stock_split().affected or (probe.probe_stock_v2_order().affected)
    assert report.exit_code == (1 if harmed else 0)
    if harmed:
        assert report.verdict.startswith("fix NOT working")
        assert any("does not build right" in p for p in report.problems)


def test_verdict_comes_from_the_attention_output_too():
    """Builder checks pass, but the registered backend's output on the forward step is wrong:
    NOT working, and the problem says where."""
    wrong = doctor_answers.forward(right=False)
    report = doctor.collect({**passing_fresh_process_checks(), "forward": lambda: wrong})
    assert report.exit_code == 1 and report.verdict.startswith("fix NOT working")
    assert any("attention output on the c step is wrong" in p for p in report.problems)


PROBLEM_KINDS = {
    # kind: (variables to set, checks answered otherwise, words of the PROBLEM line); a table,
    # whose rows are alike in shape only
    "switch not understood": ({"VLLM_ROCM_AITER_PLUGIN": "bogus"}, {},
                              "VLLM_ROCM_AITER_PLUGIN='bogus' is not understood"),
    "own build not understood": ({"VLLM_ROCM_AITER_PLUGIN_OWN_BUILD": "sometimes"}, {},
                                 "VLLM_ROCM_AITER_PLUGIN_OWN_BUILD='sometimes' is not understood"),
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
    "overridden by another package": ({}, {"resolution": doctor_answers.resolution("o.B")},
                                      "ROCM_AITER_FA is overridden by o.B"),
    "builder wrong": ({}, {"resolution": doctor_answers.resolution(builds=False)},
                      "its builder does not build right on this vLLM (v2_order: "),
    "attention output wrong": ({}, {"forward": doctor_answers.forward(right=False)},
                               "the plugin's attention output on the c step is wrong"),
    "release refused by the policy": (
        {}, {"policy": policy.Decision(False, "WARNING", "vLLM 0.1.0 is older than 0.20.0"),
             "resolution": doctor_answers.resolution(doctor_answers.STOCK)},
        "vLLM 0.1.0 is older than 0.20.0"),
    "not resolving, no cause found": (
        {}, {"resolution": doctor_answers.resolution(doctor_answers.STOCK)},
        "ROCM_AITER_FA does not resolve to the plugin in a fresh vLLM process"),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(PROBLEM_KINDS))
def test_every_kind_of_problem_gives_exit_1_and_one_problem_line(kind, monkeypatch):
    """A CI health check exists to catch a misconfiguration: each PROBLEM the doctor can report
    makes it exit 1, whatever else holds, and is printed as one PROBLEM line."""
    env, checks, words = PROBLEM_KINDS[kind]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    answers = {name: (lambda value=value: value) for name, value in checks.items()}
    report = doctor.collect({**healthy_in_process_checks(), **answers})
    assert report.check_errors == {}
    assert report.exit_code == 1, (report.verdict, report.problems)
    assert [p for p in report.problems if words in p], report.problems
    out = io.StringIO()
    doctor_output.render(report, out)
    printed = [line for line in out.getvalue().splitlines() if line.startswith("PROBLEM")]
    assert len(printed) == len(report.problems)


def test_a_healthy_install_has_no_problem_exits_0_and_ends_with_the_verdict():
    """Control for the cases above: the same answers without a planted problem. The table ends
    with the verdict; the JSON document has the report's keys."""
    report = doctor.collect(healthy_in_process_checks())
    assert (report.problems, report.exit_code) == ([], 0), report.problems
    assert report.verdict.startswith("fix ACTIVE")
    out = io.StringIO()
    doctor_output.render(report, out)
    assert out.getvalue().rstrip().splitlines()[-1] == report.verdict
    assert "ROCM_AITER_FA resolves to" in out.getvalue()
    assert set(__import__("json").loads(doctor_output.to_json(report))) == TOP_LEVEL_KEYS


TOP_LEVEL_KEYS = {
    "versions", "gpu", "aiter", "variables", "split", "plugins", "resolution", "forward",
    "check_errors", "policy", "problems", "notes", "verdict", "exit_code",
}  # fmt: skip


@pytest.mark.parametrize(
    "value, meaning",
    [
        ("bogus", "unknown name: automatic selection"),
        ("XFORMERS", "legacy name with no ROCm backend: automatic selection"),
        ("ROCM_FLASH", "legacy name for ROCM_ATTN"),
    ],
)
def test_the_doctor_says_what_vllm_attention_backend_selects(value, meaning, monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", value)
    report = doctor.collect(healthy_in_process_checks())
    variable = next(v for v in report.variables if v.name == "VLLM_ATTENTION_BACKEND")
    assert variable.value == value and variable.reading.meaning.startswith(meaning)
    problem = variable.reading.problem
    assert (problem is not None) is (value != "ROCM_FLASH")
    assert report.problems == ([problem] if problem else [])
    assert report.exit_code == (0 if problem is None else 1)


def test_a_refused_backend_names_the_backends_rocm_offers(monkeypatch):
    """The PROBLEM for a backend ROCm never offers names what vLLM's ROCm selection offers
    instead, and the variable's line no longer says that it selects the backend."""
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASH_ATTN")
    report = doctor.collect(healthy_in_process_checks())
    (problem,) = report.problems
    assert problem.startswith("VLLM_ATTENTION_BACKEND=FLASH_ATTN will not be honoured")
    assert "ROCM_ATTN" in problem
    variable = next(v for v in report.variables if v.name == "VLLM_ATTENTION_BACKEND")
    meaning = variable.reading.meaning
    assert "not honoured" in meaning or "never offers" in meaning
    assert report.exit_code == 1


@pytest.mark.parametrize("name", ["ROCM_AITER_FA", "TRITON_MLA"])
def test_a_backend_rocm_offers_for_some_layers(monkeypatch, name):
    """Off ROCm the variable is not read: a name vLLM's ROCm selection offers for some layer is a
    NOTE saying so, not a PROBLEM. On a ROCm GPU the verdict is the selection's own on this GPU
    (``tests/commands/test_backend_selection.py`` holds the two together)."""
    from vllm.platforms import current_platform

    from vllm_rocm_aiter_plugin.diagnostics.backend_choice import verdict_here

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
    anyway, from the version the plugin's policy reads (``vllm.__version__``, through the one
    function that reads it, answered here: vLLM itself is left as it is)."""
    from vllm_rocm_aiter_plugin import registration

    monkeypatch.setattr(registration, "vllm_version_for_policy", lambda: ("dev", False))
    stock = doctor_answers.resolution(doctor_answers.STOCK)
    plugins = doctor.Plugins("site-packages", True, True, [])
    checks = {**passing_fresh_process_checks(), "resolution": lambda: stock}
    report = doctor.collect({**checks, "plugins": lambda: plugins})
    assert report.versions is not None and report.versions.vllm == "dev"
    assert report.versions.vllm_in_tested_range is False
    assert report.policy is not None and "'dev', which cannot be parsed" in report.policy.message
    (problem,) = report.problems
    assert "VLLM_ROCM_AITER_PLUGIN=force to take the fix anyway" in problem
    assert report.exit_code == 1


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


def test_a_full_stdout_gives_exit_2_and_one_line(monkeypatch, capsys, tmp_path):
    """The report cannot be written (``/dev/full``: ENOSPC at the flush): exit 2, one line on
    stderr, no traceback, and stdout pointed elsewhere so that the interpreter's own final flush
    does not fail again. (A closed stdout: ``tests/commands/test_doctor.py``.)"""
    full = open("/dev/full", "w")
    monkeypatch.setattr(doctor_output, "run", lambda **kwargs: print("x" * 10, file=sys.stdout))
    monkeypatch.setattr(sys, "stdout", full)
    try:
        code = cli.main(["doctor", "--json"])
        full.write("flushed again")
        full.flush()  # fd now points at /dev/null: nothing fails
    finally:
        full.close()
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("vllm-rocm-aiter-plugin: cannot write the report to stdout")
    assert str(errno.ENOSPC) in line or "No space left" in line


def test_all_cases_runs_the_doctors_steps_then_every_other_case_of_the_catalogue_once():
    """``doctor --all-cases``: its own steps first (they must run here), then the catalogue."""
    from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES, doctor_steps

    request, own = doctor.forward_request(None, "cpu", all_cases=True)
    names = [case.name for case in request.cases]
    steps = [case.name for case in doctor_steps(None, "cpu")]
    assert names[: len(steps)] == steps and own == set(steps)
    assert sorted(names) == sorted({case.name for case in CASES} | own)
    assert [c.name for c in doctor.forward_request(None, "cpu")[0].cases] == steps
    assert "--all-cases" in cli._parser()[1].format_help()


def test_a_catalogue_case_this_release_cannot_run_is_set_aside_the_doctors_own_is_not():
    report = doctor_answers.forward().report
    case = report.cases[0]
    aside = dataclasses.replace(case, case="extra", not_applicable="no sinks here", outcomes={})
    extended = dataclasses.replace(report, cases=[case, aside])
    check = doctor.check_forward(extended, own={case.case})
    assert check.right and "extra: set aside (no sinks here)" in check.detail
    with pytest.raises(RuntimeError, match="no sinks here"):
        doctor.check_forward(extended, own={case.case, "extra"})


def test_a_non_causal_step_is_judged_as_the_tiers_judge_it():
    """On a non-causal step rows with context are off in stock's path and the plugin's alike;
    a row without context off the reference is still wrong."""
    from vllm_rocm_aiter_plugin.diagnostics.forward.report import Row

    report = doctor_answers.forward().report
    case = report.cases[0]
    rows = [Row("with-context", 10, 5, "extend", 1.0, False)]
    outcome = dataclasses.replace(case["registered"], rows=rows)
    non_causal = dataclasses.replace(case, configuration={**case.configuration, "causal": False},
                                     outcomes={**case.outcomes, "registered": outcome})  # fmt: skip
    assert doctor.check_forward(dataclasses.replace(report, cases=[non_causal])).right
    rows.append(Row("no-context", 0, 5, "prefill", 1.0, False))
    assert not doctor.check_forward(dataclasses.replace(report, cases=[non_causal])).right
