"""The doctor's checks answered as on a healthy install, so that the one problem a test plants is
all that differs (``doctor.collect(overrides)``)."""

from __future__ import annotations

from typing import Any

from vllm_rocm_aiter_plugin import policy
from vllm_rocm_aiter_plugin.diagnostics import doctor


def passing_fresh_process_checks() -> dict[str, Any]:
    """The two checks that start fresh processes, answered as on a healthy install."""
    resolution = doctor.Resolution(policy.BACKEND_QUALNAME, "b", True, None, True, {})
    forward = doctor.Forward("c", "cpu", "k", False, True, "ok", [], 1, 1)
    return {"resolution": lambda: resolution, "forward": lambda: forward}


def healthy_in_process_checks() -> dict[str, Any]:
    """The checks that would otherwise report this machine's own findings, answered as on a
    healthy install, plus :func:`passing_fresh_process_checks`."""
    plugins = doctor.Plugins("site-packages", True, True, [])
    active = doctor.Policy(True, "INFO", "ROCM_AITER_FA -> the plugin")
    return {**passing_fresh_process_checks(), "plugins": lambda: plugins, "policy": lambda: active}
