"""``vllm-rocm-aiter-plugin doctor``: is the installed vLLM affected, and is the fix active?

Each check runs on its own; one that cannot run is reported (exit code 2) without hiding the
others. Exit codes: 0 = fix active or not needed, 1 = affected and the fix is not active, 2 = the
doctor could not run a check. ``--json`` prints one object with stable keys.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from vllm_rocm_aiter_plugin import policy

EXIT_OK, EXIT_NOT_ACTIVE, EXIT_CHECK_FAILED = 0, 1, 2


def _aiter_env() -> dict[str, Any]:
    use_aiter = os.environ.get("VLLM_ROCM_USE_AITER")
    use_mha = os.environ.get("VLLM_ROCM_USE_AITER_MHA")
    aiter_on = (use_aiter or "false").lower() in ("true", "1")
    mha_on = (use_mha or "true").lower() in ("true", "1")
    if aiter_on and mha_on:
        implies = "ROCM_AITER_FA is eligible for automatic backend selection on ROCm"
    elif aiter_on:
        implies = (
            "VLLM_ROCM_USE_AITER_MHA disables AITER attention in auto-selection; "
            "ROCM_AITER_FA only with --attention-backend ROCM_AITER_FA"
        )
    else:
        implies = (
            "auto-selection will not pick ROCM_AITER_FA; set VLLM_ROCM_USE_AITER=1 or pass "
            "--attention-backend ROCM_AITER_FA"
        )
    return {
        "VLLM_ROCM_USE_AITER": use_aiter,
        "VLLM_ROCM_USE_AITER_MHA": use_mha,
        "aiter_attention_autoselect": aiter_on and mha_on,
        "implies": implies,
    }


def _versions() -> dict[str, Any]:
    import torch
    import vllm

    from vllm_rocm_aiter_plugin import __version__

    return {
        "plugin": __version__,
        "vllm": vllm.__version__,
        "vllm_tested_range": [
            policy.format_version(policy.MIN_SUPPORTED_VLLM),
            policy.format_version(policy.NEWEST_TESTED_VLLM),
        ],
        "vllm_in_tested_range": policy.in_tested_range(vllm.__version__),
        "torch": torch.__version__,
        "torch_hip": getattr(torch.version, "hip", None),
        "torch_cuda": getattr(torch.version, "cuda", None),
    }


def _gpu() -> dict[str, Any] | None:
    from vllm_rocm_aiter_plugin.diagnostics.hardware import detect_gpu

    gpu = detect_gpu()
    if gpu is None:
        return None
    return {"name": gpu.name, "arch": gpu.arch, "rocm": gpu.is_rocm, "mi300_class": gpu.mi300_class}


def _aiter() -> dict[str, Any]:
    from vllm_rocm_aiter_plugin.diagnostics.hardware import probe_aiter

    info = probe_aiter()
    return {"importable": info.importable, "version": info.version, "error": info.error}


def _split() -> dict[str, Any]:
    from vllm_rocm_aiter_plugin.diagnostics.probe import probe_stock_split, probe_stock_v2_order

    eagle, v2_order = probe_stock_split(), probe_stock_v2_order()
    return {
        "stock_split_affected": eagle.affected,
        "detail": eagle.detail,
        "stock_split_drops_context_v2_order": v2_order.affected,
        "v2_order_detail": v2_order.detail,
    }


def _plugins() -> dict[str, Any]:
    from importlib.metadata import entry_points

    def ours(group: str) -> bool:
        return any(ep.name == policy.PLUGIN_NAME for ep in entry_points(group=group))

    allowlist = policy.parse_vllm_plugins(os.environ.get("VLLM_PLUGINS"))
    others = sorted(
        ep.name
        for ep in entry_points(group="vllm.platform_plugins")
        if ep.name != policy.PLUGIN_NAME and policy.plugin_allowed(allowlist, ep.name)
    )
    switch, problem = policy.parse_switch(os.environ.get(policy.SWITCH_ENV))
    return {
        "general_entry_point": ours("vllm.general_plugins"),
        "platform_entry_point": ours("vllm.platform_plugins"),
        "VLLM_PLUGINS": os.environ.get("VLLM_PLUGINS"),
        "allowed_by_VLLM_PLUGINS": policy.plugin_allowed(allowlist),
        "kill_switch": switch.value,
        "kill_switch_problem": problem,
        "other_platform_plugins": others,
    }


def _resolution() -> dict[str, Any]:
    """In a fresh interpreter: what vLLM resolves ``ROCM_AITER_FA`` to, and whether that
    backend's builder builds the EAGLE pure-decode batch and the model-runner V2 batch right."""
    from vllm_rocm_aiter_plugin.diagnostics.probe import resolve_in_fresh_process

    resolved = resolve_in_fresh_process()
    return resolution_report(resolved)


def resolution_report(resolved: dict[str, Any]) -> dict[str, Any]:
    """The doctor's ``resolution`` section from a probe result (see ``_resolution``)."""
    path, stock, behaviour = resolved["path"], resolved["stock"], resolved["behaviour"]
    return {
        "ROCM_AITER_FA": path,
        "builder": resolved["builder"],
        "resolves_to_plugin": path == policy.BACKEND_QUALNAME,
        "overridden_by_other": None if path in (stock, policy.BACKEND_QUALNAME) else path,
        "builds_correctly": all(case["ok"] for case in behaviour.values()),
        "behaviour": behaviour,
    }


CHECKS: dict[str, Callable[[], Any]] = {
    "versions": _versions,
    "gpu": _gpu,
    "aiter": _aiter,
    "aiter_env": _aiter_env,
    "split": _split,
    "plugins": _plugins,
    "resolution": _resolution,
}


def collect(checks: dict[str, Callable[[], Any]] | None = None) -> dict[str, Any]:
    """Run every check; return the report (the JSON object) with verdict and exit code."""
    report: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name, check in {**CHECKS, **(checks or {})}.items():
        try:
            report[name] = check()
        except Exception as exc:
            report[name] = None
            failed[name] = f"{type(exc).__name__}: {exc}"
    try:
        report["policy"] = _policy(report)
    except Exception as exc:
        report["policy"] = None
        failed["policy"] = f"{type(exc).__name__}: {exc}"
    report["check_errors"] = failed
    report["verdict"], report["exit_code"] = _verdict(report)
    report["problems"] = _problems(report)
    report["notes"] = _notes(report)
    return report


def _policy(report: dict[str, Any]) -> dict[str, Any] | None:
    """The activation policy's decision for this vLLM and switch, as the general plugin takes it
    in a vLLM process (given the override the fresh process found, if another package's)."""
    versions, plugins = report.get("versions"), report.get("plugins")
    if not versions or not plugins:
        return None
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    stock = AttentionBackendEnum.ROCM_AITER_FA.value
    other = (report.get("resolution") or {}).get("overridden_by_other")
    decision = policy.decide_registration(
        versions["vllm"], policy.Switch(plugins["kill_switch"]), other or stock, stock
    )
    return {
        "overrides_rocm_aiter_fa": decision.activate,
        "level": logging.getLevelName(decision.level),
        "message": decision.message,
    }


def _problems(report: dict[str, Any]) -> list[str]:
    problems = []
    plugins, resolution, versions = (
        report.get("plugins"),
        report.get("resolution"),
        report.get("versions"),
    )
    if plugins:
        if not plugins["general_entry_point"]:
            problems.append(
                "the vllm.general_plugins entry point is missing: reinstall with "
                "`pip install --no-deps --force-reinstall vllm-rocm-aiter-plugin`"
            )
        if not plugins["allowed_by_VLLM_PLUGINS"]:
            problems.append(
                f"VLLM_PLUGINS={plugins['VLLM_PLUGINS']!r} excludes the plugin (vLLM splits it at "
                f"commas without stripping blanks): add {policy.PLUGIN_NAME} to it, or unset "
                "VLLM_PLUGINS"
            )
        if plugins["kill_switch"] == policy.Switch.OFF.value:
            problems.append(f"{policy.SWITCH_ENV} disables the plugin: unset it to enable the fix")
        if plugins["kill_switch_problem"]:
            problems.append(plugins["kill_switch_problem"])
        if plugins["other_platform_plugins"]:
            others = ", ".join(plugins["other_platform_plugins"])
            problems.append(
                f"other out-of-tree platform plugins are installed ({others}):"
                " the plugin's platform steps aside on ROCm (the builder fix still applies; "
                "use --attention-backend rather than VLLM_ATTENTION_BACKEND)"
            )
    if resolution and resolution["overridden_by_other"]:
        problems.append(
            f"ROCM_AITER_FA is overridden by {resolution['overridden_by_other']}: uninstall that "
            f"package, or set {policy.SWITCH_ENV}=force to replace it"
        )
    if resolution and resolution["resolves_to_plugin"] and not resolution["builds_correctly"]:
        wrong = [
            f"{name}: {case['detail']}"
            for name, case in resolution["behaviour"].items()
            if not case["ok"]
        ]
        problems.append(
            "ROCM_AITER_FA resolves to the plugin but its builder does not build right on this "
            f"vLLM ({'; '.join(wrong)}): the plugin does not support this vLLM's build(); "
            "check the README's release table and report the vLLM version"
        )
    decision = report.get("policy")
    refused_version = (
        decision is not None
        and not decision["overrides_rocm_aiter_fa"]
        and decision["level"] == "WARNING"
        and not (resolution and resolution["overridden_by_other"])
    )
    if refused_version:  # this vLLM's version (below the range, or unparsable): the policy's words
        problems.append(decision["message"])
    elif versions and not versions["vllm_in_tested_range"]:
        problems.append(
            f"vLLM {versions['vllm']} is outside the tested range "
            f"{'-'.join(versions['vllm_tested_range'])}: check the README's release table"
        )
    if report["exit_code"] == EXIT_NOT_ACTIVE and not problems:
        problems.append(
            "ROCM_AITER_FA does not resolve to the plugin in a fresh vLLM process and no cause "
            "was found here: run `VLLM_LOGGING_LEVEL=DEBUG python -c 'from vllm.plugins import "
            "load_general_plugins; load_general_plugins()'` and read the plugin loader's lines"
        )
    return problems


def _notes(report: dict[str, Any]) -> list[str]:
    """What this machine cannot do (informational: the exit code does not change)."""
    notes = []
    versions, aiter = report.get("versions") or {}, report.get("aiter") or {}
    gpu = report.get("gpu")
    if "gpu" not in report["check_errors"] and (gpu is None or not gpu.get("rocm")):
        what = "no GPU" if gpu is None else f"{gpu['name']} is not a ROCm GPU"
        notes.append(
            f"this machine cannot run ROCM_AITER_FA: {what} (torch {versions.get('torch')}, HIP "
            f"{versions.get('torch_hip') or 'none'}); the verdict is about the installed vLLM "
            "and the plugin"
        )
    elif gpu is not None and not gpu.get("mi300_class"):
        notes.append(f"{gpu['name']} ({gpu['arch']}) is not MI300-class (gfx942, gfx950)")
    if aiter and not aiter.get("importable"):
        notes.append(
            f"this machine cannot run ROCM_AITER_FA kernels: aiter is not importable "
            f"({aiter.get('error')})"
        )
    return notes


def _verdict(report: dict[str, Any]) -> tuple[str, int]:
    split, resolution = report.get("split"), report.get("resolution")
    if split is None or resolution is None:
        missing = ", ".join(sorted(report["check_errors"])) or "unknown"
        return f"doctor could not run: {missing}", EXIT_CHECK_FAILED
    harms = []
    if split["stock_split_affected"]:
        harms.append("EAGLE on ROCM_AITER_FA will crash")
    if split["stock_split_drops_context_v2_order"]:
        harms.append("model-runner V2 steps can lose context silently")
    if resolution["resolves_to_plugin"] and resolution["builds_correctly"]:
        return (
            "fix ACTIVE: ROCM_AITER_FA resolves to the plugin, whose builder builds the EAGLE "
            "pure-decode batch and keeps rows with context out of the prefill region",
            EXIT_OK,
        )
    if not harms:
        return (
            "fix not needed: this vLLM's stock split handles EAGLE pure-decode batches and "
            "model-runner V2 order",
            EXIT_OK,
        )
    if resolution["resolves_to_plugin"]:
        return (
            f"fix NOT working: the plugin's builder fails the checks on this vLLM; "
            f"{'; '.join(harms)} (see problems)",
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


def render(report: dict[str, Any], out: TextIO) -> None:
    rows: list[tuple[str, Any]] = []
    v = report.get("versions") or {}
    rows += [
        ("plugin", v.get("plugin")),
        ("vLLM", f"{v.get('vllm')} (tested {'-'.join(v.get('vllm_tested_range', []))}: "
         f"{_fmt(v.get('vllm_in_tested_range'))})"),
        ("torch", f"{v.get('torch')} (HIP {_fmt(v.get('torch_hip'))}, CUDA {_fmt(v.get('torch_cuda'))})"),
    ]  # fmt: skip
    gpu = report.get("gpu")
    gpu_text = (
        "no GPU"
        if gpu is None
        else f"{gpu['name']} ({gpu['arch']}; MI300-class: {_fmt(gpu['mi300_class'])})"
    )
    rows.append(("GPU", gpu_text if "gpu" not in report["check_errors"] else "check failed"))
    a = report.get("aiter") or {}
    rows.append(("aiter", f"importable: {_fmt(a.get('importable'))}, version {_fmt(a.get('version'))}"
                 + (f" ({a['error']})" if a.get("error") else "")))  # fmt: skip
    e = report.get("aiter_env") or {}
    rows.append(
        (
            "VLLM_ROCM_USE_AITER[_MHA]",
            f"{_fmt(e.get('VLLM_ROCM_USE_AITER'))} / {_fmt(e.get('VLLM_ROCM_USE_AITER_MHA'))}: "
            f"{e.get('implies')}",
        )
    )
    s = report.get("split") or {}
    rows.append(
        ("stock split affected", f"{_fmt(s.get('stock_split_affected'))} ({s.get('detail')})")
    )
    rows.append(
        (
            "stock drops context (V2 order)",
            f"{_fmt(s.get('stock_split_drops_context_v2_order'))} ({s.get('v2_order_detail')})",
        )
    )
    p = report.get("plugins") or {}
    rows += [
        ("entry points (general/platform)",
         f"{_fmt(p.get('general_entry_point'))} / {_fmt(p.get('platform_entry_point'))}"),
        ("VLLM_PLUGINS",
         f"{_fmt(p.get('VLLM_PLUGINS'))} (allows plugin: {_fmt(p.get('allowed_by_VLLM_PLUGINS'))})"),
        (policy.SWITCH_ENV, p.get("kill_switch")),
        ("other platform plugins", _fmt(p.get("other_platform_plugins"))),
    ]  # fmt: skip
    rows.append(("policy", (report.get("policy") or {}).get("message")))
    r = report.get("resolution") or {}
    rows.append(("ROCM_AITER_FA resolves to", r.get("ROCM_AITER_FA")))
    for name, case in (r.get("behaviour") or {}).items():
        rows.append(
            (f"  its builder, {name}", f"{'ok' if case['ok'] else 'WRONG'}: {case['detail']}")
        )
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {_fmt(value)}", file=out)
    for name, error in report["check_errors"].items():
        print(f"CHECK FAILED  {name}: {error}", file=out)
    for problem in report["problems"]:
        print(f"PROBLEM  {problem}", file=out)
    for note in report["notes"]:
        print(f"NOTE  {note}", file=out)
    print(f"\n{report['verdict']}", file=out)


def run(as_json: bool = False, out: TextIO = sys.stdout) -> int:
    report = collect()
    if as_json:
        print(json.dumps(report, indent=2, sort_keys=True), file=out)
    else:
        render(report, out)
    return report["exit_code"]
