"""Entry points through vLLM's own plugin loader, each scenario in a fresh interpreter (vLLM loads
its plugins once per process). The switch's and ``VLLM_PLUGINS``' spellings are parsed in
``tests/unit/test_envs.py``; here each way of turning the plugin on or off, once."""

from __future__ import annotations

import importlib.metadata

import pytest

from tests.helpers import environment
from tests.helpers.subprocess_util import run_child
from vllm_rocm_aiter_plugin import envs, policy

PLUGIN_BACKEND = policy.BACKEND_QUALNAME
STOCK_BACKEND = "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend"
# With the switch unset the plugin takes over from the oldest release in the README's table on;
# an older vLLM (an old image) stays stock, and tests about something else then force it.
ACTIVE = environment.plugin_overrides_by_default()
DEFAULT_BACKEND = PLUGIN_BACKEND if ACTIVE else STOCK_BACKEND

RESOLVE = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
report({"path": AttentionBackendEnum.ROCM_AITER_FA.get_path()})
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
    assert general.get(envs.PLUGIN_NAME) == "vllm_rocm_aiter_plugin:register"
    assert platform.get(envs.PLUGIN_NAME) == "vllm_rocm_aiter_plugin:platform_plugin"


@pytest.fixture(scope="module")
def default_process():
    """One vLLM process with the switch unset: what ROCM_AITER_FA resolves to (class, builder),
    a spawned child's answer, 100 more registrations, and the platform plugin's answer."""
    return run_child(
        """
        import multiprocessing
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from tests.helpers.spawn_worker import resolve_rocm_aiter_fa
        import vllm_rocm_aiter_plugin
        backend = AttentionBackendEnum.ROCM_AITER_FA
        cls = backend.get_class()
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=resolve_rocm_aiter_fa, args=(queue,))
        proc.start()
        spawned = queue.get(timeout=240)
        proc.join(timeout=60)
        for _ in range(100):
            vllm_rocm_aiter_plugin.register()
        def path(member):
            try:
                return member.get_path()
            except ValueError:  # placeholder members with no class until registered
                return None
        direct = vllm_rocm_aiter_plugin.platform_plugin()
        from vllm.platforms import current_platform
        report({
            "path": backend.get_path(), "class": f"{cls.__module__}.{cls.__qualname__}",
            "builder": cls.get_builder_cls().__name__, "spawned": spawned,
            "spawn_exit": proc.exitcode, "overridden": backend.is_overridden(),
            "ours": [m.name for m in AttentionBackendEnum if path(m) == backend.get_path()],
            "direct": direct, "platform": type(current_platform).__module__,
        })
        """
    )


def test_default_resolution_with_one_log_line(default_process):
    """Switch unset: the plugin with one INFO line (WARNING on a release newer than the table);
    stock with one WARNING saying why on a release older than the table."""
    result, output = default_process.result, default_process.output
    if not ACTIVE:
        assert result["path"] == STOCK_BACKEND
        refusals = [line for line in output.splitlines() if "is older than" in line]
        assert len(refusals) == 1 and "WARNING" in refusals[0], output[-3000:]
        return
    assert (result["path"], result["class"]) == (PLUGIN_BACKEND, PLUGIN_BACKEND)
    assert result["builder"] == "PluginAiterFlashAttentionMetadataBuilder"
    lines = _activation_lines(output)
    level = "INFO" if environment.vllm_in_tested_range() else "WARNING"
    assert len(lines) == 1 and level in lines[0], output[-3000:]


def test_a_spawned_child_process_sees_the_override_with_its_own_line(default_process):
    result = default_process.result
    assert (result["spawned"]["path"], result["spawn_exit"]) == (DEFAULT_BACKEND, 0)
    # At most one line of its own (observed: one on vLLM 0.23.0, none on 0.34.0)
    assert len(_activation_lines(result["spawned"]["log"])) <= 1


def test_registering_many_times_leaves_one_override_and_one_line(default_process):
    result = default_process.result
    assert result["ours"] == ["ROCM_AITER_FA"] and result["overridden"] is ACTIVE
    assert len(_activation_lines(default_process.output)) == (1 if ACTIVE else 0)


def test_platform_plugin_activates_exactly_on_a_rocm_gpu(default_process):
    """Active where /dev/kfd exists and torch sees a ROCm GPU and no other out-of-tree platform
    plugin is installed; None elsewhere (a CPU box, a CUDA box)."""
    others = [
        ep.name
        for ep in importlib.metadata.entry_points(group="vllm.platform_plugins")
        if ep.name != envs.PLUGIN_NAME
    ]
    expected = environment.kfd_present() and environment.rocm_gpu() and not others
    result = default_process.result
    if expected:
        assert result["direct"] == policy.PLATFORM_QUALNAME
        assert result["platform"] == "vllm_rocm_aiter_plugin.platform"
    else:
        assert result["direct"] is None
        assert not result["platform"].startswith("vllm_rocm_aiter_plugin")


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"VLLM_PLUGINS": envs.PLUGIN_NAME}, DEFAULT_BACKEND),
        ({"VLLM_PLUGINS": "some_other_plugin"}, STOCK_BACKEND),
        ({"VLLM_PLUGINS": ""}, STOCK_BACKEND),
        ({"VLLM_ROCM_AITER_PLUGIN": "0"}, STOCK_BACKEND),
    ],
    ids=["allowlisted", "not-allowlisted", "empty-allowlist", "kill-switch"],
)
def test_enable_and_disable(env, expected):
    child = run_child(RESOLVE, env)
    assert child.result["path"] == expected
    if expected == STOCK_BACKEND:
        assert not _activation_lines(child.output)


def test_existing_override_is_kept_with_a_warning_and_replaced_by_force():
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


def test_observe_mode_resolves_to_stocks_backend_with_a_counting_builder_and_warns_once():
    child = run_child(
        RESOLVE.replace(
            'report({"path"',
            'cls = AttentionBackendEnum.ROCM_AITER_FA.get_class()\nreport({"impl": '
            'cls.get_impl_cls().__module__, "path"',
        ),
        {"VLLM_ROCM_AITER_PLUGIN": "observe"},
    )
    assert (
        child.result["path"] == "vllm_rocm_aiter_plugin.backend.ObservingAiterFlashAttentionBackend"
    )
    assert child.result["impl"] == "vllm.v1.attention.backends.rocm_aiter_fa"  # stock's impl
    lines = [line for line in child.output.splitlines() if "=observe: ROCM_AITER_FA" in line]
    assert len(lines) == 1 and "WARNING" in lines[0], child.output[-3000:]
    assert not _activation_lines(child.output)
