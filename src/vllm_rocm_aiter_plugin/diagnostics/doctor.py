"""``vllm-rocm-aiter-plugin doctor``: is the installed vLLM affected, and is the fix active?

Every verdict comes from running things: vLLM's own split on the batches that break it, the
registered backend's builder in a fresh vLLM process, and vLLM's real ROCM_AITER_FA forward on a
model-runner V2 step (on a GPU with its kernels; on CPU with vLLM's Triton kernels under the
interpreter and torch references for AITER's). Each check runs on its own; one that cannot run is
named and gives exit code 2, and the problems the others found are still reported. Exit codes:
0 = fix active or not needed, 1 = affected and the fix not active (or not working), or any
PROBLEM line (a misconfiguration an operator should fix), 2 = a check could not run. ``--json``
prints one object with stable keys.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib
import json
import logging
import os
import site
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from vllm_rocm_aiter_plugin import envs, policy

if TYPE_CHECKING:
    from vllm_rocm_aiter_plugin.diagnostics.forward.cases import ForwardCase

EXIT_OK, EXIT_NOT_ACTIVE, EXIT_CHECK_FAILED = 0, 1, 2
DISTRIBUTION = "vllm-rocm-aiter-plugin"


@dataclass
class Versions:
    plugin: str
    vllm: str
    vllm_tested_range: list[str]
    vllm_in_tested_range: bool
    torch: str
    torch_hip: str | None
    torch_cuda: str | None


@dataclass
class Gpu:
    name: str
    arch: str | None
    rocm: bool
    mi300_class: bool


@dataclass
class Aiter:
    importable: bool
    version: str | None
    error: str | None


@dataclass
class VariableReport:
    name: str
    owner: str
    value: str | None
    meaning: str
    problem: str | None
    note: str | None = None


@dataclass
class Split:
    stock_split_affected: bool
    detail: str
    stock_split_drops_context_v2_order: bool
    v2_order_detail: str


@dataclass
class Plugins:
    distribution: str | None  # where the installed distribution lives
    general_entry_point: bool
    platform_entry_point: bool
    other_platform_plugins: list[str]


@dataclass
class Resolution:
    ROCM_AITER_FA: str
    builder: str
    resolves_to_plugin: bool
    overridden_by_other: str | None
    builds_correctly: bool
    behaviour: dict[str, dict[str, Any]]


@dataclass
class Forward:
    case: str
    device: str
    kernels: str
    merge_makes_nan_of_empty_states: bool
    registered_right: bool
    registered_detail: str
    stock_wrong_requests: list[str]
    chunks: int | None
    v1_stock_chunks: int | str | None
    v1_order_absent: str | None = None  # why V1 order does not apply (no V1 runner), or None
    takes_sinks: bool = False
    vllm_counts_sink_once: bool | None = None  # vLLM's own extend path, run (0.34.0: True)
    unified_attention: str = ""
    configuration: dict[str, Any] = field(default_factory=dict)  # what the forward ran in


@dataclass(frozen=True)
class ServingConfiguration:
    """The operator's configuration the forward check runs in, as ``vllm serve`` spells it
    (``--kv-cache-dtype``, ``--block-size``, ``--head-size`` of the model); None: the case's."""

    kv_cache_dtype: str | None = None
    block_size: int | None = None
    head_size: int | None = None
    kv_cache_layout: str | None = None  # "SHUFFLE": VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT is on

    def changes(self, device: str) -> dict[str, Any]:
        """The forward cases' fields this configuration sets. An fp8 cache takes the format of
        the GPU it runs on (``current_platform.fp8_dtype()``), on CPU MI300's, with scales that
        are not 1, as a checkpoint's are."""
        changes: dict[str, Any] = {}
        if self.block_size is not None:
            changes["block_size"] = self.block_size
        if self.head_size is not None:
            changes["head_size"] = self.head_size
        if self.kv_cache_dtype is not None:
            changes["kv_cache_dtype"] = self.kv_cache_dtype
        if self.kv_cache_dtype not in (None, "auto"):
            fp8_format = "float8_e4m3fnuz"
            if device != "cpu":
                from vllm.platforms import current_platform

                fp8_format = str(current_platform.fp8_dtype()).removeprefix("torch.")
            changes.update(fp8_format=fp8_format, k_scale=0.05, v_scale=0.08)
        if self.kv_cache_layout is not None:
            changes["kv_cache_layout"] = self.kv_cache_layout
        return changes


@dataclass
class Policy:
    overrides_rocm_aiter_fa: bool
    level: str
    message: str


@dataclass
class DoctorReport:
    versions: Versions | None = None
    gpu: Gpu | None = None
    aiter: Aiter | None = None
    variables: list[VariableReport] = field(default_factory=list)
    split: Split | None = None
    plugins: Plugins | None = None
    resolution: Resolution | None = None
    forward: Forward | None = None
    policy: Policy | None = None
    check_errors: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verdict: str = ""
    exit_code: int = EXIT_CHECK_FAILED

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- checks: each returns its section, or raises (the doctor then names it) ----------------


def check_versions() -> Versions:
    import torch

    from vllm_rocm_aiter_plugin import __version__, vllm_version_for_policy

    vllm_version, build_verified = vllm_version_for_policy()
    return Versions(
        plugin=__version__,
        vllm=vllm_version,
        vllm_tested_range=[
            policy.format_version(policy.MIN_SUPPORTED_VLLM),
            policy.format_version(policy.NEWEST_TESTED_VLLM),
        ],
        vllm_in_tested_range=policy.in_tested_range(vllm_version, build_verified),
        torch=torch.__version__,
        torch_hip=getattr(torch.version, "hip", None),
        torch_cuda=getattr(torch.version, "cuda", None),
    )


def check_gpu() -> Gpu | None:
    from vllm_rocm_aiter_plugin.diagnostics.hardware import detect_gpu

    gpu = detect_gpu()
    if gpu is None:
        return None
    return Gpu(gpu.name, gpu.arch, gpu.is_rocm, gpu.mi300_class)


def check_aiter() -> Aiter:
    from vllm_rocm_aiter_plugin.diagnostics.hardware import probe_aiter

    info = probe_aiter()
    return Aiter(info.importable, info.version, info.error)


def check_variables(configuration: ServingConfiguration | None = None) -> list[VariableReport]:
    """Every variable the plugin reads (``envs.VARIABLES``), its value and what it does;
    ``VLLM_ATTENTION_BACKEND`` judged for the operator's ``configuration`` where given."""
    from vllm_rocm_aiter_plugin.env_backend import resolve

    reports = []
    for variable in envs.VARIABLES:
        raw = os.environ.get(variable.name)
        shown = None if raw is None else envs.cut(raw)
        if variable.name == envs.ATTENTION_BACKEND:
            reports.append(_attention_backend_report(variable, raw, resolve(raw), configuration))
            continue
        reading = variable.parse(raw)
        reports.append(
            VariableReport(variable.name, variable.owner, shown, reading.meaning, reading.problem)
        )
    return reports


def _attention_backend_report(
    variable: envs.Variable,
    raw: str | None,
    reading: envs.Reading,
    configuration: ServingConfiguration | None = None,
) -> VariableReport:
    """``VLLM_ATTENTION_BACKEND``: which backend the name selects needs vLLM's list (``envs``
    reads it without vLLM); whether it is honoured here, the plugin's own selection on each kind
    of layer (:mod:`.backend_choice`)."""
    from vllm_rocm_aiter_plugin.diagnostics.backend_choice import verdict_here

    shown = None if raw is None else envs.cut(raw)
    report = VariableReport(variable.name, variable.owner, shown, reading.meaning, reading.problem)
    if reading.value is None:
        return report
    name = reading.value.name
    served = configuration or ServingConfiguration()
    try:
        verdict = verdict_here(
            name,
            head_size=served.head_size or 128,
            kv_cache_dtype=served.kv_cache_dtype or "auto",
            block_size=served.block_size,
        )
    except (LookupError, OSError, SyntaxError) as exc:
        report.problem = (
            f"{variable.name}={name}: whether it is honoured could not be checked on this vLLM "
            f"({type(exc).__name__}: {exc})"
        )
        return report
    report.problem = verdict.problem
    report.note = verdict.note
    report.meaning = verdict.meaning or report.meaning
    return report


def check_split() -> Split:
    from vllm_rocm_aiter_plugin.diagnostics.probe import probe_stock_split, probe_stock_v2_order

    eagle, v2_order = probe_stock_split(), probe_stock_v2_order()
    return Split(eagle.affected, eagle.detail, v2_order.affected, v2_order.detail)


def installed_distribution() -> Any:
    """The plugin's distribution as pip installed it: looked up in the site-packages directories
    only, never in the current directory (a stale ``*.egg-info`` in a checkout)."""
    from importlib.metadata import distributions

    paths = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    paths.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    paths.add(site.getusersitepackages())
    for dist in distributions(path=sorted(p for p in paths if os.path.isdir(p))):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") == DISTRIBUTION:
            return dist
    return None


def check_plugins() -> Plugins:
    from vllm_rocm_aiter_plugin import other_platform_plugins

    dist = installed_distribution()
    groups = {(ep.group, ep.name) for ep in dist.entry_points} if dist is not None else set()
    return Plugins(
        distribution=None if dist is None else str(dist.locate_file("")),
        general_entry_point=("vllm.general_plugins", policy.PLUGIN_NAME) in groups,
        platform_entry_point=("vllm.platform_plugins", policy.PLUGIN_NAME) in groups,
        other_platform_plugins=other_platform_plugins(),
    )


def check_resolution() -> Resolution:
    """In a fresh interpreter: what vLLM resolves ``ROCM_AITER_FA`` to, and whether that
    backend's builder builds the EAGLE pure-decode batch and the model-runner V2 batches right."""
    from vllm_rocm_aiter_plugin.diagnostics.probe import resolve_in_fresh_process

    return resolution_report(resolve_in_fresh_process())


def resolution_report(resolved: dict[str, Any]) -> Resolution:
    """The ``resolution`` section from a probe result (see ``check_resolution``)."""
    path, stock, behaviour = resolved["path"], resolved["stock"], resolved["behaviour"]
    return Resolution(
        ROCM_AITER_FA=path,
        builder=resolved["builder"],
        resolves_to_plugin=path == policy.BACKEND_QUALNAME,
        overridden_by_other=None if path in (stock, policy.BACKEND_QUALNAME) else path,
        builds_correctly=all(case["ok"] for case in behaviour.values()),
        behaviour=behaviour,
    )


def forward_cases(configuration: ServingConfiguration | None, device: str) -> list[ForwardCase]:
    """The forward check's steps: a model-runner V2 step whose extend region holds a new prompt
    and two context chunks; an EAGLE verification step without the upper bound (its decode path
    calls AITER's ``unified_attention``); where this release's ROCM_AITER_FA takes attention
    sinks, a V2 step with sinks, whose extend path relies on how AITER counts a sink on the causal
    new-token call. In the operator's ``configuration`` where one is given. In the shuffle
    KV-cache layout, where vLLM serves no EAGLE verification and no sinks, the first step and the
    sink step's batch without sinks: its decode takes the layout's own decode kernel."""
    from vllm_rocm_aiter_plugin.diagnostics.forward import harness, runner
    from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
        CASES_BY_NAME,
        DOCTOR_CASE,
        DOCTOR_EAGLE_CASE,
        DOCTOR_SHUFFLE_DECODE_CASE,
        DOCTOR_SINK_CASE,
    )

    configuration = configuration or ServingConfiguration()
    if configuration.kv_cache_layout == "SHUFFLE" and harness.shuffle_layout_unavailable() == (
        harness.NO_SHUFFLE_LAYOUT
    ):
        configuration = dataclasses.replace(configuration, kv_cache_layout=None)  # vLLM ignores it
    if configuration.kv_cache_layout == "SHUFFLE":
        decode_step = dataclasses.replace(
            CASES_BY_NAME[DOCTOR_SINK_CASE], name=DOCTOR_SHUFFLE_DECODE_CASE, sinks=()
        )
        steps = [CASES_BY_NAME[DOCTOR_CASE], decode_step]
    else:
        names = [DOCTOR_CASE, DOCTOR_EAGLE_CASE] + [DOCTOR_SINK_CASE] * runner.takes_sinks()
        steps = [CASES_BY_NAME[n] for n in names]
    changes = configuration.changes(device)
    return [dataclasses.replace(case, **changes) for case in steps]


def check_forward(configuration: ServingConfiguration | None = None) -> Forward:
    """vLLM's ROCM_AITER_FA forward on :func:`forward_cases`, with stock's backend and the
    registered one, in a fresh process: on the GPU where there is one, else on CPU (Triton
    interpreter; AITER's Triton kernel where its wheel loads, references for the rest)."""
    import torch

    from vllm_rocm_aiter_plugin.diagnostics.forward import runner

    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = runner.run_in_child(
        kinds=("stock", "registered"), device=device, timeout=900,
        cases=forward_cases(configuration, device),
    )  # fmt: skip
    if "unavailable" in report:
        raise RuntimeError(report["unavailable"])
    return forward_report(report)


def forward_report(report: dict[str, Any]) -> Forward:
    from vllm_rocm_aiter_plugin.diagnostics.forward import kernels_ran

    case = report["cases"][0]  # the model-runner V2 step; the others are checked alike
    for step in report["cases"]:
        if "not_applicable" in step:
            raise RuntimeError(f"the forward check cannot run here: {step['not_applicable']}")

    def wrong(result: dict[str, Any], tolerance: float) -> list[str]:
        if "rows" not in result:
            return []
        return [r["req_id"] for r in result["rows"] if r["nan"] or r["error"] > tolerance]

    details, right = [], True
    for step in report["cases"]:
        registered = step["registered"]
        if "error" in registered:
            right = False
            details.append(f"{step['case']}: {registered['error']}")
            continue
        bad = wrong(registered, step["tolerance"])
        right = right and not bad
        nan = sum(1 for r in registered["rows"] if r["nan"])
        details.append(
            f"{len(registered['rows'])} requests equal to the reference, no NaN"
            if not bad
            else f"{len(bad)} requests off the reference ({nan} NaN)"
        )
        if step is not case:
            details[-1] = f"{step['case']}: {details[-1]}"
    registered, detail = case["registered"], "; ".join(details)
    return Forward(
        case=case["case"],
        device=report["device"],
        kernels=kernels_ran.kernels_line(report),
        merge_makes_nan_of_empty_states=report["merge_makes_nan_of_empty_states"],
        registered_right=right,
        registered_detail=detail,
        stock_wrong_requests=wrong(case["stock"], case["tolerance"]),
        chunks=registered.get("chunks"),
        v1_stock_chunks=case.get("v1_stock_chunks"),
        v1_order_absent=report.get("v1_order_absent"),
        takes_sinks=bool(report.get("takes_sinks")),
        vllm_counts_sink_once=report.get("vllm_counts_sink_once"),
        unified_attention=kernels_ran.unified_attention_line(report),
        configuration=case.get("configuration", {}),
    )


def check_policy(resolution: Resolution | None) -> Policy:
    """The activation policy's decision for this vLLM and switch, as the general plugin takes it
    in a vLLM process, from the same version (``vllm.__version__``) and the override the fresh
    process found, if another package's."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_rocm_aiter_plugin import vllm_version_for_policy

    stock = AttentionBackendEnum.ROCM_AITER_FA.value
    other = resolution.overridden_by_other if resolution is not None else None
    vllm_version, build_verified = vllm_version_for_policy()
    decision = policy.decide_registration(
        vllm_version, envs.read(envs.SWITCH).value, other or stock, stock, build_verified
    )
    return Policy(decision.activate, logging.getLevelName(decision.level), decision.message)


IN_PROCESS: dict[str, Callable[[], Any]] = {
    "versions": check_versions,
    "gpu": check_gpu,
    "aiter": check_aiter,
    "variables": check_variables,
    "split": check_split,
    "plugins": check_plugins,
}
FRESH_PROCESS: dict[str, Callable[[], Any]] = {
    "resolution": check_resolution,
    "forward": check_forward,
}
FRESH_PROCESS_MODULES = (
    "torch",
    "vllm_rocm_aiter_plugin.diagnostics.probe",
    "vllm_rocm_aiter_plugin.diagnostics.forward.runner",
    "vllm_rocm_aiter_plugin.diagnostics.forward.cases",
)
"""What the fresh-process checks import; :func:`collect` imports it before their threads start."""


def collect(
    overrides: dict[str, Callable[[], Any]] | None = None,
    configuration: ServingConfiguration | None = None,
) -> DoctorReport:
    """Run every check (the two that start fresh processes side by side), the forward one in the
    operator's ``configuration``; the report."""
    checks = {**IN_PROCESS, **FRESH_PROCESS, **(overrides or {})}
    if configuration is not None and not (overrides and "forward" in overrides):
        checks["forward"] = functools.partial(check_forward, configuration)
    if configuration is not None and not (overrides and "variables" in overrides):
        checks["variables"] = functools.partial(check_variables, configuration)
    report = DoctorReport()
    results: dict[str, Any] = {}
    # The threads only wait on child processes, so they must import nothing: a thread importing
    # vLLM's modules while this one does can deadlock (Python raises _DeadlockError; seen on vLLM
    # 0.24.0). A module that fails to import here fails again, and is reported, in its check.
    for module in FRESH_PROCESS_MODULES:
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(checks[name]) for name in FRESH_PROCESS}
        for name in IN_PROCESS:
            results[name] = _run(checks[name], name, report)
        for name, future in futures.items():
            results[name] = _run(future.result, name, report)
    for name, value in results.items():
        if name not in report.check_errors:
            setattr(report, name, value)
    policy_check = checks.get("policy", lambda: check_policy(report.resolution))
    report.policy = _run(policy_check, "policy", report)
    report.verdict, report.exit_code = _verdict(report)
    report.problems = _problems(report)
    if report.problems and report.exit_code == EXIT_OK:  # a misconfiguration is worth an exit 1
        count = len(report.problems)
        report.exit_code = EXIT_NOT_ACTIVE
        report.verdict += f"; but {count} PROBLEM line{'s' if count > 1 else ''} above to fix"
    report.notes = _notes(report)
    return report


def _run(check: Callable[[], Any], name: str, report: DoctorReport) -> Any:
    try:
        return check()
    except Exception as exc:
        report.check_errors[name] = f"{type(exc).__name__}: {exc}".strip()
        return None


def _problems(report: DoctorReport) -> list[str]:
    """What the operator should fix; each line comes from the check that found it."""
    problems = [v.problem for v in report.variables if v.problem]
    switch = envs.read(envs.SWITCH).value
    if switch is envs.Switch.OFF:
        problems.append(f"{envs.SWITCH} disables the plugin: unset it to enable the fix")
    plugins, resolution, forward = report.plugins, report.resolution, report.forward
    if plugins is not None:
        if not plugins.general_entry_point:
            problems.append(
                "the vllm.general_plugins entry point is missing from the installed "
                f"distribution: reinstall with `pip install --no-deps --force-reinstall "
                f"{DISTRIBUTION}`"
            )
        if plugins.other_platform_plugins:
            others = ", ".join(plugins.other_platform_plugins)
            problems.append(
                f"other out-of-tree platform plugins are installed ({others}): the plugin's "
                "platform steps aside on ROCm (the builder fix still applies; use "
                "--attention-backend rather than VLLM_ATTENTION_BACKEND)"
            )
    if resolution is not None and resolution.overridden_by_other:
        problems.append(
            f"ROCM_AITER_FA is overridden by {resolution.overridden_by_other}: uninstall that "
            f"package, or set {envs.SWITCH}=force to replace it"
        )
    if resolution is not None and resolution.resolves_to_plugin and not resolution.builds_correctly:
        wrong = [
            f"{name}: {case['detail']}"
            for name, case in resolution.behaviour.items()
            if not case["ok"]
        ]
        problems.append(
            "ROCM_AITER_FA resolves to the plugin but its builder does not build right on this "
            f"vLLM ({'; '.join(wrong)}): check docs/releases.md and report the vLLM version"
        )
    if forward is not None and resolution is not None and resolution.resolves_to_plugin:
        if not forward.registered_right:
            problems.append(
                f"the plugin's attention output on the {forward.case} step is wrong on this vLLM "
                f"({forward.registered_detail}): report the vLLM version"
            )
    decision = report.policy
    refused_version = (
        decision is not None
        and not decision.overrides_rocm_aiter_fa
        and decision.level == "WARNING"
        and not (resolution and resolution.overridden_by_other)
    )
    if refused_version and decision is not None:  # below the range, or unparsable
        problems.append(decision.message)
    if report.exit_code == EXIT_NOT_ACTIVE and not problems:
        problems.append(
            "ROCM_AITER_FA does not resolve to the plugin in a fresh vLLM process and no cause "
            "was found here: run `VLLM_LOGGING_LEVEL=DEBUG python -c 'from vllm.plugins import "
            "load_general_plugins; load_general_plugins()'` and read the plugin loader's lines"
        )
    return problems


def _notes(report: DoctorReport) -> list[str]:
    """What this machine cannot do, and what the checks above already settle (informational: the
    exit code does not change)."""
    notes = [v.note for v in report.variables if v.note]
    decision = report.policy
    if decision is not None and decision.level == "WARNING" and decision.overrides_rocm_aiter_fa:
        # newer than tested (or forced): the checks above ran the plugin on this very vLLM
        notes.append(f"{decision.message} The checks above ran the plugin on this vLLM.")
    versions, aiter, gpu = report.versions, report.aiter, report.gpu
    if "gpu" not in report.check_errors and (gpu is None or not gpu.rocm):
        what = "no GPU" if gpu is None else f"{gpu.name} is not a ROCm GPU"
        torch_line = (
            f" (torch {versions.torch}, HIP {versions.torch_hip or 'none'})" if versions else ""
        )
        notes.append(
            f"this machine cannot run ROCM_AITER_FA: {what}{torch_line}; the verdict is about "
            "the installed vLLM and the plugin"
        )
    elif gpu is not None and not gpu.mi300_class:
        notes.append(f"{gpu.name} ({gpu.arch}) is not MI300-class (gfx942, gfx950)")
    if aiter is not None and not aiter.importable:
        notes.append(
            f"this machine cannot run AITER's kernels: aiter is not importable ({aiter.error})"
        )
    if report.forward is not None and "references" in report.forward.kernels:
        notes.append(
            f"the forward check ran on {report.forward.device}: vLLM's own forward code and "
            f"Triton kernels, with {report.forward.kernels.split('; ')[-1]}; as AITER's "
            f"unified_attention: {report.forward.unified_attention}; AITER's compiled kernels "
            "were not run"
        )
    return notes


def _verdict(report: DoctorReport) -> tuple[str, int]:
    if report.check_errors:
        names = ", ".join(sorted(report.check_errors))
        return f"doctor could not run: {names} (see check_errors)", EXIT_CHECK_FAILED
    split, resolution, forward = report.split, report.resolution, report.forward
    assert split is not None and resolution is not None and forward is not None
    harms = []
    if split.stock_split_affected:
        harms.append("EAGLE on ROCM_AITER_FA will crash")
    if split.stock_split_drops_context_v2_order or forward.stock_wrong_requests:
        harms.append("model-runner V2 steps can lose context silently")
    if resolution.resolves_to_plugin and resolution.builds_correctly and forward.registered_right:
        return (
            "fix ACTIVE: ROCM_AITER_FA resolves to the plugin, whose builder builds the EAGLE "
            "pure-decode batch and keeps rows with context out of the prefill region, and whose "
            "attention output on a model-runner V2 step equals the reference",
            EXIT_OK,
        )
    if not harms:
        return (
            "fix not needed: this vLLM's stock split handles EAGLE pure-decode batches and "
            "model-runner V2 order",
            EXIT_OK,
        )
    if resolution.resolves_to_plugin:
        return (
            f"fix NOT working: the plugin fails the checks on this vLLM; {'; '.join(harms)} "
            "(see problems)",
            EXIT_NOT_ACTIVE,
        )
    return (
        f"AFFECTED and the fix is NOT active: {'; '.join(harms)} (see problems)",
        EXIT_NOT_ACTIVE,
    )


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _rows(report: DoctorReport) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    v = report.versions
    if v is not None:
        in_range = _fmt(v.vllm_in_tested_range)
        rows.append(("plugin", v.plugin))
        rows.append(("vLLM", f"{v.vllm} (tested {'-'.join(v.vllm_tested_range)}: {in_range})"))
        rows.append(("torch", f"{v.torch} (HIP {_fmt(v.torch_hip)}, CUDA {_fmt(v.torch_cuda)})"))
    if "gpu" not in report.check_errors:
        gpu = report.gpu
        shown = "no GPU" if gpu is None else f"{gpu.name} ({gpu.arch}; MI300-class: "
        rows.append(("GPU", shown if gpu is None else f"{shown}{_fmt(gpu.mi300_class)})"))
    if report.aiter is not None:
        a = report.aiter
        error = f" ({a.error})" if a.error else ""
        rows.append(
            ("aiter", f"importable: {_fmt(a.importable)}, version {_fmt(a.version)}{error}")
        )
    for variable in report.variables:
        if variable.owner != "tests":
            value = "" if variable.value is None else f"{variable.value!r}: "
            rows.append((variable.name, f"{value}{variable.meaning}"))
    if report.split is not None:
        s = report.split
        rows.append(("stock split affected", f"{_fmt(s.stock_split_affected)} ({s.detail})"))
        drops = _fmt(s.stock_split_drops_context_v2_order)
        rows.append(("stock drops context (V2 order)", f"{drops} ({s.v2_order_detail})"))
    if report.plugins is not None:
        p = report.plugins
        points = f"{_fmt(p.general_entry_point)} / {_fmt(p.platform_entry_point)}"
        rows.append(("entry points (general/platform)", points))
        rows.append(("other platform plugins", _fmt(p.other_platform_plugins)))
    if report.policy is not None:
        rows.append(("policy", report.policy.message))
    if report.resolution is not None:
        r = report.resolution
        rows.append(("ROCM_AITER_FA resolves to", r.ROCM_AITER_FA))
        for name, case in r.behaviour.items():
            verdict = "ok" if case["ok"] else "WRONG"
            rows.append((f"  its builder, {name}", f"{verdict}: {case['detail']}"))
    if report.forward is not None:
        f = report.forward
        rows.append((f"forward, {f.case}", f"on {f.device}: ROCM_AITER_FA {f.registered_detail}"))
        if f.configuration:
            rows.append(("  served in", configuration_line(f.configuration)))
        rows.append(("  stock's backend", f"{len(f.stock_wrong_requests)} requests wrong"))
        compared = (
            "vLLM has no V1 runner to compare with"
            if f.v1_order_absent
            else f"vLLM, in its own V1 order: {_fmt(f.v1_stock_chunks)}"
        )
        chunks = (
            f"{_fmt(f.chunks)} ({compared}). Each pass reads a slice of every request's cached "
            "context: fewer passes, a faster step"
        )
        rows.append(("  passes over cached context", chunks))
        merge = (
            "vLLM's merge gives NaN on this vLLM; the plugin's output stays finite"
            if f.merge_makes_nan_of_empty_states
            else "vLLM's merge keeps them finite on this vLLM"
        )
        rows.append(("  two empty context chunks", merge))
        rows.append(("  attention sinks", sinks_line(f)))
    return rows


def sinks_line(forward: Forward) -> str:
    """What the plugin does with a layer's attention sinks on this vLLM, from vLLM's own extend
    path as the forward child ran it."""
    if not forward.takes_sinks:
        return "this vLLM's ROCM_AITER_FA takes none"
    if forward.vllm_counts_sink_once:
        return (
            "vLLM's extend path counts a sink once itself (fixed upstream in 0.34.0): the "
            "plugin leaves it as it is"
        )
    if forward.vllm_counts_sink_once is None:
        return (
            "could not be read off vLLM's extend path: the plugin passes the sink to the "
            "new-token call only, which counts it once either way"
        )
    return (
        "vLLM's extend path counts a sink once per call; the plugin passes it to the new-token "
        "call only, so it counts once"
    )


def configuration_line(configuration: dict[str, Any]) -> str:
    """A forward case's configuration, as ``vllm serve`` options name it."""
    cache = configuration.get("kv_cache_dtype", "auto")
    if configuration.get("fp8_format"):
        cache += (
            f" ({configuration['fp8_format'].removeprefix('float8_')}, k/v scales "
            f"{configuration['k_scale']:g}/{configuration['v_scale']:g})"
        )
    layout = (
        ", VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1"
        if configuration.get("kv_cache_layout") == "SHUFFLE"
        else ""
    )
    return (
        f"--kv-cache-dtype {cache}, --block-size {configuration.get('block_size')}, "
        f"head size {configuration.get('head_size')}, {configuration.get('dtype')}{layout}"
    )


def render(report: DoctorReport, out: TextIO) -> None:
    rows = _rows(report)
    width = max(len(label) for label, _ in rows) if rows else 0
    for label, value in rows:
        print(f"{label:<{width}}  {_fmt(value)}", file=out)
    for name, error in report.check_errors.items():
        print(f"CHECK FAILED  {name}: {error}", file=out)
    for problem in report.problems:
        print(f"PROBLEM  {problem}", file=out)
    for note in report.notes:
        print(f"NOTE  {note}", file=out)
    print(f"\n{report.verdict}", file=out)


def run(
    as_json: bool = False,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    configuration: ServingConfiguration | None = None,
) -> int:
    """Collect the report (its forward check in ``configuration`` where given), then print vLLM's
    log as :mod:`.vllm_log` sums it up (stderr), then the report (stdout: the table ending with
    the verdict, or one JSON document)."""
    from vllm_rocm_aiter_plugin.diagnostics import vllm_log

    with vllm_log.held_back() as held:
        report = collect(configuration=configuration)
    vllm_log.print_summary(held, err)
    if as_json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True), file=out)
    else:
        render(report, out)
    return report.exit_code
