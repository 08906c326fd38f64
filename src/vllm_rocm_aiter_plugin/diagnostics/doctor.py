"""``vllm-rocm-aiter-plugin doctor``'s checks: is the installed vLLM affected, is the fix active?"""

from __future__ import annotations

import dataclasses
import os
import site
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_rocm_aiter_plugin import envs, policy
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
    CASES,
    ServingConfiguration,
    doctor_steps,
)
from vllm_rocm_aiter_plugin.diagnostics.forward.report import (
    ForwardReport,
    ForwardRequest,
    Resolution,
)
from vllm_rocm_aiter_plugin.diagnostics.hardware import AiterInfo, GpuInfo, detect_gpu, probe_aiter
from vllm_rocm_aiter_plugin.diagnostics.probe import SplitProbe

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
    vllm_build_fingerprint: str | None = None  # of ROCM_AITER_FA's build() source
    own_build: bool = False  # whether the plugin's own build body runs here (a verified source)
    builder_error: str | None = None  # why the plugin's builder does not import here


@dataclass
class VariableReport:
    """One variable: its value as set (cut for display) and what the plugin makes of it."""

    name: str
    owner: str
    value: str | None
    reading: envs.Reading
    note: str | None = None


@dataclass
class Plugins:
    distribution: str | None  # where the installed distribution lives
    general_entry_point: bool
    platform_entry_point: bool
    other_platform_plugins: list[str]


@dataclass
class ForwardCheck:
    """The forward run's report (its resolution is the doctor's own section), and whether the
    registered backend is right on every step."""

    report: ForwardReport
    right: bool
    detail: str
    stock_wrong: list[str]  # stock's wrong requests on the first step
    stock_without_context: int = 0  # requests stock's split served without their context
    counted: int = 0  # what the registered backend's builder counted of them (None counts 0)


@dataclass
class DoctorReport:
    versions: Versions | None = None
    gpu: GpuInfo | None = None
    aiter: AiterInfo | None = None
    variables: list[VariableReport] = field(default_factory=list)
    split: dict[str, SplitProbe] = field(default_factory=dict)  # "eagle", "v2_order"
    plugins: Plugins | None = None
    resolution: Resolution | None = None
    forward: ForwardCheck | None = None
    policy: policy.Decision | None = None
    check_errors: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verdict: str = ""
    exit_code: int = EXIT_CHECK_FAILED


# ---- checks: each returns its section, or raises (the doctor then names it) ----------------


def check_versions() -> Versions:
    import torch

    from vllm_rocm_aiter_plugin import __version__, releases
    from vllm_rocm_aiter_plugin.registration import vllm_version_for_policy

    vllm_version, build_verified = vllm_version_for_policy()
    fingerprint, own_build, builder_error = None, False, None
    try:  # imports vLLM's ROCM_AITER_FA module, which imports AITER on some releases under ROCm
        from vllm_rocm_aiter_plugin import builder

        own_build = builder.own_build_default()
        fingerprint = builder.build_fingerprint()
    except (OSError, TypeError):  # no source to read
        pass
    except Exception as exc:  # the resolution check reports what this means for the backend
        builder_error = f"{type(exc).__name__}: {exc}"
    return Versions(
        plugin=__version__,
        vllm=vllm_version,
        vllm_tested_range=[releases.OLDEST, releases.NEWEST],
        vllm_in_tested_range=policy.in_tested_range(vllm_version, build_verified),
        torch=torch.__version__,
        torch_hip=getattr(torch.version, "hip", None),
        torch_cuda=getattr(torch.version, "cuda", None),
        vllm_build_fingerprint=fingerprint,
        own_build=own_build,
        builder_error=builder_error,
    )


def check_variables(configuration: ServingConfiguration | None = None) -> list[VariableReport]:
    """Every variable the plugin reads (``envs.VARIABLES``), its value and what it does;
    ``VLLM_ATTENTION_BACKEND`` judged on this machine (:mod:`.backend_choice`) for the operator's
    ``configuration`` where given."""
    from vllm_rocm_aiter_plugin.diagnostics.backend_choice import variable_reading

    served = configuration or ServingConfiguration()
    reports = []
    for variable in envs.VARIABLES:
        raw = os.environ.get(variable.name)
        shown = None if raw is None else envs.cut(raw)
        if variable.name == envs.ATTENTION_BACKEND:
            reading, note = variable_reading(
                raw, served.head_size or 128, served.kv_cache_dtype or "auto", served.block_size
            )
            reports.append(VariableReport(variable.name, variable.owner, shown, reading, note))
        else:
            reports.append(
                VariableReport(variable.name, variable.owner, shown, variable.parse(raw))
            )
    return reports


def check_split() -> dict[str, SplitProbe]:
    from vllm_rocm_aiter_plugin.diagnostics.probe import probe_stock_split, probe_stock_v2_order

    return {"eagle": probe_stock_split(), "v2_order": probe_stock_v2_order()}


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
    from vllm_rocm_aiter_plugin.registration import other_platform_plugins

    dist = installed_distribution()
    groups = {(ep.group, ep.name) for ep in dist.entry_points} if dist is not None else set()
    return Plugins(
        distribution=None if dist is None else str(dist.locate_file("")),
        general_entry_point=("vllm.general_plugins", envs.PLUGIN_NAME) in groups,
        platform_entry_point=("vllm.platform_plugins", envs.PLUGIN_NAME) in groups,
        other_platform_plugins=other_platform_plugins(),
    )


def forward_request(
    configuration: ServingConfiguration | None, device: str, all_cases: bool = False
) -> tuple[ForwardRequest, set[str]]:
    """The fresh process's request, with stock's backend and the registered one: the doctor's own
    steps (in the operator's ``configuration``), then with ``all_cases`` every other case of the
    catalogue as it is defined; and the names of the doctor's steps, which must run here."""
    steps = doctor_steps(configuration, device)
    own = {step.name for step in steps}
    cases = [*steps, *(case for case in CASES if all_cases and case.name not in own)]
    return ForwardRequest(cases, ["stock", "registered"], device, resolution=True), own


def start_fresh_process(request: ForwardRequest) -> Callable[[], ForwardReport]:
    """Start the fresh vLLM process on ``request`` (and what ``ROCM_AITER_FA`` resolves to).
    Returns the call that waits for its report (once; an error is raised to every caller)."""
    from vllm_rocm_aiter_plugin.diagnostics.forward import runner

    outcome: list[Any] = []
    try:
        started = runner.start(request, timeout=300 * max(3, len(request.cases)))
    except Exception as exc:
        outcome.append(exc)

    def report() -> ForwardReport:
        if not outcome:
            try:
                outcome.append(runner.finish(started))
            except Exception as exc:
                outcome.append(exc)
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    return report


def check_resolution(report: ForwardReport) -> Resolution:
    if report.resolution is None:
        raise RuntimeError(report.resolution_error or "the fresh process reported no resolution")
    return report.resolution


def check_forward(report: ForwardReport, own: set[str] | None = None) -> ForwardCheck:
    """The registered backend's output on every step that runs here, and stock's wrong requests
    on the first. The doctor's own steps (``own``; None: every step) must run here; another
    catalogue case this release cannot run is set aside with its reason."""
    if report.unavailable:
        raise RuntimeError(report.unavailable)
    details, right = [], True
    for step in report.cases:
        if step.not_applicable and (own is None or step.case in own):
            raise RuntimeError(f"the forward check cannot run here: {step.not_applicable}")
        if step.not_applicable:
            details.append(f"{step.case}: set aside ({step.not_applicable})")
            continue
        registered = step["registered"]
        bad = registered.wrong(step.tolerance)
        if not step.configuration.get("causal", True):
            # Rows with context are off in stock's paths and the plugin's alike (vLLM's extend
            # path runs causally: docs/upstream/README.md); the others must be right
            bad -= {r.req_id for r in registered.rows if r.context and not r.nan}
        right = right and not registered.error and not bad
        detail = registered.error or (
            f"{len(bad)} requests off the reference ({len(registered.nan())} NaN)"
            if bad
            else f"{len(registered.rows)} requests equal to the reference, no NaN"
        )
        details.append(detail if step is report.cases[0] else f"{step.case}: {detail}")
    first = report.cases[0]
    stock_wrong = sorted(first["stock"].wrong(first.tolerance))
    ran = [s for s in report.cases if not s.not_applicable and s.configuration.get("causal", True)]
    lost = sum(len(s["stock"].served_without_context()) for s in ran)
    counted = sum((s["registered"].counted or {}).get("request_steps", 0) for s in ran)
    kept = dataclasses.replace(report, resolution=None)  # the doctor's own section holds it
    return ForwardCheck(kept, right, "; ".join(details), stock_wrong, lost, counted)


def check_policy(resolution: Resolution | None) -> policy.Decision:
    """The activation policy's decision for this vLLM and switch, as the general plugin takes it
    in a vLLM process, from the same version (``vllm.__version__``) and the override the fresh
    process found, if another package's."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_rocm_aiter_plugin.registration import vllm_version_for_policy

    stock = AttentionBackendEnum.ROCM_AITER_FA.value
    other = overridden_by_other(resolution)
    vllm_version, build_verified = vllm_version_for_policy()
    return policy.decide_registration(
        vllm_version, envs.read(envs.SWITCH).value, other or stock, stock, build_verified
    )


def resolves_to_plugin(resolution: Resolution | None) -> bool:
    return resolution is not None and resolution.path == policy.BACKEND_QUALNAME


def overridden_by_other(resolution: Resolution | None) -> str | None:
    ours = (
        (resolution.stock, policy.BACKEND_QUALNAME, policy.OBSERVING_QUALNAME) if resolution else ()
    )
    if resolution is None or resolution.path in ours:
        return None
    return resolution.path


IN_PROCESS = ("versions", "gpu", "aiter", "variables", "split", "plugins")
FRESH_PROCESS = ("resolution", "forward")


def collect(
    overrides: dict[str, Callable[[], Any]] | None = None,
    configuration: ServingConfiguration | None = None,
    all_cases: bool = False,
) -> DoctorReport:
    """Every check (``overrides`` answer some instead), the forward one in the operator's
    ``configuration`` (and on every catalogue case with ``all_cases``): the fresh process first,
    then this process's checks while it runs."""
    checks: dict[str, Callable[[], Any]] = {
        "versions": check_versions, "gpu": detect_gpu, "aiter": probe_aiter,
        "variables": lambda: check_variables(configuration), "split": check_split,
        "plugins": check_plugins,
    }  # fmt: skip
    overrides = overrides or {}
    if not set(FRESH_PROCESS) <= overrides.keys():
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        request, own = forward_request(configuration, device, all_cases)
        fresh = start_fresh_process(request)
        checks["resolution"] = lambda: check_resolution(fresh())
        checks["forward"] = lambda: check_forward(fresh(), own)
    checks.update(overrides)
    report = DoctorReport()
    for name in (*IN_PROCESS, *FRESH_PROCESS):
        setattr(report, name, _run(checks[name], name, report))
    report.policy = _run(checks.get("policy", lambda: check_policy(report.resolution)),
                         "policy", report)  # fmt: skip
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
        return [] if name == "variables" else {} if name == "split" else None


def _problems(report: DoctorReport) -> list[str]:
    """What the operator should fix; each line comes from the check that found it."""
    problems = [v.reading.problem for v in report.variables if v.reading.problem]
    switch = envs.read(envs.SWITCH).value
    if switch is envs.Switch.OFF:
        problems.append(f"{envs.SWITCH} disables the plugin: unset it to enable the fix")
    if switch is envs.Switch.OBSERVE:
        problems.append(
            f"{envs.SWITCH}=observe: ROCM_AITER_FA serves stock's output and the plugin only "
            "counts the requests stock serves without their context: unset it to enable the fix"
        )
    plugins, resolution, forward = report.plugins, report.resolution, report.forward
    if plugins is not None and not plugins.general_entry_point:
        problems.append(
            "the vllm.general_plugins entry point is missing from the installed distribution: "
            f"reinstall with `pip install --no-deps --force-reinstall {DISTRIBUTION}`"
        )
    if plugins is not None and plugins.other_platform_plugins:
        problems.append(
            f"other out-of-tree platform plugins are installed "
            f"({', '.join(plugins.other_platform_plugins)}): the plugin's platform steps aside on "
            "ROCm (the builder fix still applies; use --attention-backend rather than "
            "VLLM_ATTENTION_BACKEND)"
        )
    other = overridden_by_other(resolution)
    if other:
        problems.append(
            f"ROCM_AITER_FA is overridden by {other}: uninstall that package, or set "
            f"{envs.SWITCH}=force to replace it"
        )
    if resolves_to_plugin(resolution) and resolution and not resolution.builds_correctly:
        wrong = [f"{n}: {c['detail']}" for n, c in resolution.behaviour.items() if not c["ok"]]
        problems.append(
            "ROCM_AITER_FA resolves to the plugin but its builder does not build right on this "
            f"vLLM ({'; '.join(wrong)}): check docs/releases.md and report the vLLM version"
        )
    if forward is not None and resolves_to_plugin(resolution) and not forward.right:
        problems.append(
            f"the plugin's attention output on the {forward.report.cases[0].case} step is wrong "
            f"on this vLLM ({forward.detail}): report the vLLM version"
        )
    decision = report.policy
    if decision and not decision.activate and decision.level == "WARNING" and not other:
        problems.append(decision.message)  # below the range, or unparsable
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
    fixing = decision is not None and decision.backend == policy.BACKEND_QUALNAME
    if decision is not None and decision.level == "WARNING" and decision.activate and fixing:
        # newer than tested (or forced): the checks above ran the plugin on this very vLLM
        notes.append(f"{decision.message} The checks above ran the plugin on this vLLM.")
    versions, aiter, gpu = report.versions, report.aiter, report.gpu
    if "gpu" not in report.check_errors and (gpu is None or not gpu.is_rocm):
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
    if report.forward is not None and report.forward.report.references:
        forward = report.forward.report
        notes.append(
            f"the forward check ran on {forward.device}: vLLM's own forward code and Triton "
            f"kernels, with {forward.kernels_line().split('; ')[-1]}; as AITER's "
            f"unified_attention: {forward.unified_attention_line()}; AITER's compiled kernels "
            "were not run"
        )
    return notes


def _verdict(report: DoctorReport) -> tuple[str, int]:
    if report.check_errors:
        names = ", ".join(sorted(report.check_errors))
        return f"doctor could not run: {names} (see check_errors)", EXIT_CHECK_FAILED
    split, resolution, forward = report.split, report.resolution, report.forward
    assert resolution is not None and forward is not None
    harms = []
    if split["eagle"].affected:
        harms.append("EAGLE on ROCM_AITER_FA will crash")
    if split["v2_order"].affected or forward.stock_wrong:
        harms.append("model-runner V2 steps can lose context silently")
    if resolves_to_plugin(resolution) and resolution.builds_correctly and forward.right:
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
    if resolves_to_plugin(resolution):
        return (
            f"fix NOT working: the plugin fails the checks on this vLLM; {'; '.join(harms)} "
            "(see problems)",
            EXIT_NOT_ACTIVE,
        )
    return f"AFFECTED and the fix is NOT active: {'; '.join(harms)} (see problems)", EXIT_NOT_ACTIVE
