"""Entry points through vLLM's own plugin loader, each scenario in a fresh interpreter."""

from __future__ import annotations

import importlib.metadata

import pytest

from tests.helpers import environment
from tests.helpers.subprocess_util import run_child
from vllm_rocm_aiter_plugin import policy

pytestmark = [pytest.mark.cpu, pytest.mark.subprocess]

PLUGIN_BACKEND = "vllm_rocm_aiter_plugin.backend.PluginAiterFlashAttentionBackend"
STOCK_BACKEND = "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend"
# With the switch unset the plugin takes over from the oldest release in the README's table on;
# an older vLLM (an old image) stays stock, and tests about something else then force it.
DEFAULT_BACKEND = PLUGIN_BACKEND if environment.plugin_overrides_by_default() else STOCK_BACKEND
ACTIVE_ENV = (
    {} if environment.plugin_overrides_by_default() else {"VLLM_ROCM_AITER_PLUGIN": "force"}
)

RESOLVE = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
backend = AttentionBackendEnum.ROCM_AITER_FA
cls = backend.get_class()
report({"path": backend.get_path(), "class": f"{cls.__module__}.{cls.__qualname__}",
        "builder": backend.get_class().get_builder_cls().__name__})
"""


def _activation_lines(output: str) -> list[str]:
    """The plugin's line saying it took ROCM_AITER_FA (INFO; WARNING when forced on an old vLLM)."""
    return [
        line
        for line in output.splitlines()
        if "ROCM_AITER_FA -> " + PLUGIN_BACKEND in line or "overriding ROCM_AITER_FA anyway" in line
    ]


def test_entry_points_are_installed():
    general = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
    }
    platform = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.platform_plugins")
    }
    assert general.get(policy.PLUGIN_NAME) == "vllm_rocm_aiter_plugin:register"
    assert platform.get(policy.PLUGIN_NAME) == "vllm_rocm_aiter_plugin:platform_plugin"


def test_default_resolution_with_one_log_line():
    """Switch unset: the plugin with one INFO line (WARNING on a release newer than the table);
    stock with one WARNING saying why on a release older than the table."""
    child = run_child(RESOLVE)
    if not environment.plugin_overrides_by_default():
        assert child.result == {
            "path": STOCK_BACKEND,
            "class": STOCK_BACKEND,
            "builder": "AiterFlashAttentionMetadataBuilder",
        }
        assert not _activation_lines(child.output)
        refusals = [line for line in child.output.splitlines() if "is older than" in line]
        assert len(refusals) == 1 and "WARNING" in refusals[0], child.output[-3000:]
        return
    assert child.result == {
        "path": PLUGIN_BACKEND,
        "class": PLUGIN_BACKEND,
        "builder": "PluginAiterFlashAttentionMetadataBuilder",
    }
    lines = _activation_lines(child.output)
    level = "INFO" if environment.vllm_in_tested_range() else "WARNING"
    assert len(lines) == 1 and level in lines[0], child.output[-3000:]


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"VLLM_PLUGINS": policy.PLUGIN_NAME}, DEFAULT_BACKEND),
        ({"VLLM_PLUGINS": "some_other_plugin"}, STOCK_BACKEND),
        ({"VLLM_PLUGINS": ""}, STOCK_BACKEND),
        ({"VLLM_ROCM_AITER_PLUGIN": "0"}, STOCK_BACKEND),
        ({"VLLM_ROCM_AITER_PLUGIN": "off"}, STOCK_BACKEND),
        ({"VLLM_ROCM_AITER_PLUGIN": "1"}, DEFAULT_BACKEND),
        ({"VLLM_ROCM_AITER_PLUGIN": "force"}, PLUGIN_BACKEND),
    ],
    ids=[
        "allowlisted",
        "not-allowlisted",
        "empty-allowlist",
        "kill-switch-0",
        "kill-switch-off",
        "switch-1",
        "force",
    ],
)
def test_enable_and_disable(env, expected):
    child = run_child(RESOLVE, env)
    assert child.result["path"] == expected
    assert child.result["class"] == expected
    if expected == STOCK_BACKEND:
        assert child.result["builder"] == "AiterFlashAttentionMetadataBuilder"
        assert not _activation_lines(child.output)


def test_spawned_child_process_sees_the_override():
    child = run_child(
        """
        import multiprocessing
        from vllm.plugins import load_general_plugins
        from tests.helpers.spawn_worker import resolve_rocm_aiter_fa
        load_general_plugins()
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=resolve_rocm_aiter_fa, args=(queue,))
        proc.start()
        path = queue.get(timeout=240)
        proc.join(timeout=60)
        report({"child": path, "exitcode": proc.exitcode})
        """,
        ACTIVE_ENV,
    )
    assert child.result == {"child": PLUGIN_BACKEND, "exitcode": 0}


def test_registering_many_times_leaves_one_override():
    child = run_child(
        """
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        import vllm_rocm_aiter_plugin
        for _ in range(100):
            vllm_rocm_aiter_plugin.register()
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        def path(backend):
            try:
                return backend.get_path()
            except ValueError:  # placeholder members with no class until registered
                return None
        ours = [b.name for b in AttentionBackendEnum
                if path(b) == "vllm_rocm_aiter_plugin.backend.PluginAiterFlashAttentionBackend"]
        report({"ours": ours, "overridden": AttentionBackendEnum.ROCM_AITER_FA.is_overridden()})
        """,
        ACTIVE_ENV,
    )
    assert child.result == {"ours": ["ROCM_AITER_FA"], "overridden": True}
    assert len(_activation_lines(child.output)) == 1


def test_platform_plugin_activates_exactly_on_a_rocm_gpu():
    """Active where /dev/kfd exists and torch sees a ROCm GPU and no other out-of-tree platform
    plugin is installed; None elsewhere (a CPU box, a CUDA box)."""
    child = run_child(
        """
        import vllm_rocm_aiter_plugin
        direct = vllm_rocm_aiter_plugin.platform_plugin()
        from vllm.platforms import current_platform
        report({"direct": direct, "platform": type(current_platform).__module__})
        """
    )
    others = [
        ep.name
        for ep in importlib.metadata.entry_points(group="vllm.platform_plugins")
        if ep.name != policy.PLUGIN_NAME
    ]
    expected = environment.kfd_present() and environment.rocm_gpu() and not others
    if expected:
        assert child.result["direct"] == policy.PLATFORM_QUALNAME
        assert child.result["platform"] == "vllm_rocm_aiter_plugin.platform"
    else:
        assert child.result["direct"] is None
        assert not child.result["platform"].startswith("vllm_rocm_aiter_plugin")


def test_existing_override_is_kept_with_a_warning():
    code = """
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
        register_backend(AttentionBackendEnum.ROCM_AITER_FA, "other_pkg.backend.TheirBackend")
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        report({"path": AttentionBackendEnum.ROCM_AITER_FA.get_path()})
        """
    kept = run_child(code)
    assert kept.result["path"] == "other_pkg.backend.TheirBackend"
    assert any(
        "WARNING" in line and "already overridden by other_pkg.backend.TheirBackend" in line
        for line in kept.output.splitlines()
    ), kept.output[-3000:]
    forced = run_child(code, {"VLLM_ROCM_AITER_PLUGIN": "force"})
    assert forced.result["path"] == PLUGIN_BACKEND
