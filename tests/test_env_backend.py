"""VLLM_ATTENTION_BACKEND onto a real VllmConfig, through the functions the plugin's ROCm platform
calls (``check_and_update_config`` and ``get_attn_backend_cls``): it selects what it names, legacy
names select what they meant, and no value ever stops a start."""

from __future__ import annotations

import logging

import pytest
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from tests import vllm_releases
from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.env_backend import (
    ENV_VAR,
    LEGACY_NAMES,
    apply_env_attention_backend,
    resolve,
    select_attention_backend,
)

pytestmark = pytest.mark.cpu


@pytest.fixture
def config(tiny_model_dir):
    """A fresh VllmConfig per test (the function writes to its attention config)."""
    return samples.tiny_vllm_config(tiny_model_dir)


def _warnings(caplog_vllm) -> list[str]:
    return list(
        {
            id(r): r.getMessage() for r in caplog_vllm.records if r.levelno == logging.WARNING
        }.values()
    )


def test_selects_the_named_backend_when_no_flag_was_given(config):
    assert config.attention_config.backend is None
    selected = apply_env_attention_backend(config, {ENV_VAR: "ROCM_AITER_FA"})
    assert selected is AttentionBackendEnum.ROCM_AITER_FA
    assert config.attention_config.backend is AttentionBackendEnum.ROCM_AITER_FA


@pytest.mark.parametrize("name", list(AttentionBackendEnum.__members__))
def test_every_backend_this_vllm_knows_is_accepted(name):
    assert resolve(name).value is AttentionBackendEnum[name]
    assert resolve(f" {name.lower()} ").value is AttentionBackendEnum[name]
    assert resolve(name).problem is None


@pytest.mark.parametrize("legacy", sorted(LEGACY_NAMES))
def test_legacy_names_start_cleanly(config, caplog_vllm, legacy):
    """Names launch scripts still carry: the backend they meant where this release has one on
    ROCm, else one WARNING naming the valid names and automatic selection. Never an exception."""
    selected = apply_env_attention_backend(config, {ENV_VAR: legacy})
    target = LEGACY_NAMES[legacy]
    if target is not None and target in AttentionBackendEnum.__members__:
        assert selected is AttentionBackendEnum[target]
        assert config.attention_config.backend is selected
        assert _warnings(caplog_vllm) == []
    else:
        assert selected is None and config.attention_config.backend is None
        (warning,) = _warnings(caplog_vllm)
        assert f"{ENV_VAR}={legacy!r}" in warning and "ROCM_AITER_FA" in warning


@pytest.mark.parametrize("value", ["ROCM_AITER_FAST", "bogus", "flash-attn"])
def test_unknown_names_warn_once_and_keep_automatic_selection(config, caplog_vllm, value):
    assert apply_env_attention_backend(config, {ENV_VAR: value}) is None
    assert config.attention_config.backend is None
    (warning,) = _warnings(caplog_vllm)
    assert f"{ENV_VAR}={value!r} is not an attention backend" in warning
    assert "Valid names: " in warning and "ROCM_AITER_FA" in warning


@pytest.mark.parametrize("value", ["auto", "AUTO", ""])
def test_auto_keeps_automatic_selection(config, value):
    assert apply_env_attention_backend(config, {ENV_VAR: value}) is None
    assert config.attention_config.backend is None


def test_unset_changes_nothing(config):
    assert apply_env_attention_backend(config, {}) is None
    assert config.attention_config.backend is None


def test_command_line_wins_and_a_warning_says_so(config, caplog_vllm):
    config.attention_config.backend = AttentionBackendEnum.TRITON_ATTN  # --attention-backend
    assert apply_env_attention_backend(config, {ENV_VAR: "ROCM_AITER_FA"}) is None
    assert config.attention_config.backend is AttentionBackendEnum.TRITON_ATTN
    (warning,) = _warnings(caplog_vllm)
    assert "--attention-backend TRITON_ATTN was also given and wins" in warning


def test_agreeing_flag_and_variable_do_not_warn(config, caplog_vllm):
    config.attention_config.backend = AttentionBackendEnum.ROCM_AITER_FA
    assert apply_env_attention_backend(config, {ENV_VAR: "rocm_aiter_fa"}) is None
    assert not [r for r in caplog_vllm.records if r.levelno >= logging.WARNING]


def _rejecting_select(valid: set):
    """vLLM's get_attn_backend_cls contract: the selected backend's path, ValueError when it is
    not valid for the model, the automatic choice for None."""

    def select(selected, *args, **kwargs):
        if selected is None:
            return "auto-selected"
        if selected not in valid:
            raise ValueError(f"Selected backend {selected} is not valid for this configuration.")
        return selected.get_path()

    return select


def test_a_backend_vllm_rejects_falls_back_to_automatic_selection(caplog_vllm):
    rejected = AttentionBackendEnum.FLASH_ATTN
    select = _rejecting_select(valid=set())
    assert select_attention_backend(select, rejected, rejected, "config") == "auto-selected"
    (warning,) = _warnings(caplog_vllm)
    assert f"{ENV_VAR}=FLASH_ATTN is not valid for this model" in warning


def test_a_command_line_backend_vllm_rejects_still_fails():
    """Only what the variable selected falls back: --attention-backend keeps vLLM's error."""
    select = _rejecting_select(valid=set())
    with pytest.raises(ValueError, match="is not valid"):
        select_attention_backend(select, AttentionBackendEnum.FLASH_ATTN, None, "config")


def test_a_valid_backend_is_selected_as_named():
    backend = AttentionBackendEnum.ROCM_AITER_FA
    select = _rejecting_select(valid={backend})
    assert select_attention_backend(select, backend, backend) == backend.get_path()


FAKED_GFX942 = """
import logging, types
from unittest import mock

import torch

# vLLM's ROCm platform module reads the GPU's architecture when it is imported; here a faked
# MI300X answers (torch's device query, in this child process only). Everything else is vLLM's.
mi300x = types.SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-", name="AMD Instinct MI300X",
                               major=9, minor=4, total_memory=192 << 30, multi_processor_count=304)
with mock.patch("torch.cuda.get_device_properties", return_value=mi300x):
    from vllm.platforms.rocm import RocmPlatform
    from vllm_rocm_aiter_plugin.platform import AiterRocmPlatform
from vllm.config import set_current_vllm_config
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm_rocm_aiter_plugin.diagnostics import samples

warnings = []
class Record(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())
logging.getLogger("vllm.rocm_aiter_plugin").addHandler(Record())

selector = AttentionSelectorConfig(head_size=64, dtype=torch.float16, kv_cache_dtype="auto",
                                   block_size=16)
backend = AttentionBackendEnum[NAME]

def outcome(platform):
    try:
        return platform.get_attn_backend_cls(backend, selector)
    except Exception as exc:
        return f"raises {type(exc).__name__}"

with set_current_vllm_config(samples.tiny_vllm_config()):
    report({"stock": outcome(RocmPlatform), "plugin": outcome(AiterRocmPlatform),
            "auto": RocmPlatform.get_attn_backend_cls(None, selector), "warnings": warnings,
            "arch": RocmPlatform.get_device_capability().as_version_str()})
"""


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "name, honoured",
    [("FLASH_ATTN", False), ("CPU_ATTN", False), ("TRITON_ATTN", True), ("ROCM_AITER_FA", True)],
)
def test_on_vllms_rocm_platform_only_a_backend_it_runs_is_honoured(name, honoured):
    """vLLM's real ``RocmPlatform`` (a faked gfx942): its selector takes ``CPU_ATTN`` and passes
    ``FLASH_ATTN`` (which needs the upstream flash-attn package on ROCm) on to fail later; the
    plugin's platform honours the variable only for a backend that platform runs for the model,
    and otherwise gives one WARNING and vLLM's automatic choice."""
    from tests.subprocess_util import run_child

    if name not in AttentionBackendEnum.__members__:
        pytest.skip(f"vLLM {vllm_releases.release()} has no {name} backend")
    from vllm_rocm_aiter_plugin.diagnostics.forward.harness import INTERPRETER_ENV

    # Triton under its interpreter: vLLM's ROCm candidates import Triton kernels (0.33.0)
    env = {**INTERPRETER_ENV, ENV_VAR: name}
    child = run_child(FAKED_GFX942.replace("NAME", repr(name)), env=env)
    result = child.result
    assert result["arch"].startswith("9.")  # the faked gfx942, or a real MI300's own arch
    if honoured:
        assert result["plugin"] == result["stock"] == AttentionBackendEnum[name].get_path()
        assert result["warnings"] == []
    else:
        assert result["plugin"] == result["auto"]
        (warning,) = result["warnings"]
        assert warning.startswith(f"{ENV_VAR}={name} cannot run here")
        assert "automatic selection applies" in warning
    if not honoured:  # what stock does instead: accept it (to fail later), or reject it
        assert result["stock"] in (AttentionBackendEnum[name].get_path(), "raises ValueError")
    if name == "FLASH_ATTN":  # control: vLLM's ROCm selector accepts it (0.23.0 and 0.33.0)
        assert result["stock"] == AttentionBackendEnum.FLASH_ATTN.get_path()
