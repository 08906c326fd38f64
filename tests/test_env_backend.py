"""VLLM_ATTENTION_BACKEND through the function the plugin's ROCm platform calls for backend
selection (``get_attn_backend_cls``): it selects what it names where vLLM passes no backend,
legacy names select what they meant, no value ever stops a start, and nothing of the VllmConfig
is written, so no other reader of ``attention_config.backend`` sees the variable."""

from __future__ import annotations

import logging

import pytest
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from tests import vllm_releases
from vllm_rocm_aiter_plugin import env_backend
from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.env_backend import (
    ENV_VAR,
    LEGACY_NAMES,
    resolve,
    select_attention_backend,
)
from vllm_rocm_aiter_plugin.envs import SHOWN_LIMIT
from vllm_rocm_aiter_plugin.policy import LOGGER_NAME

pytestmark = pytest.mark.cpu


@pytest.fixture(autouse=True)
def _fresh_process_lines():
    """Each selection line is logged once per process; each test is a fresh 'process' here."""
    env_backend._said.clear()
    yield
    env_backend._said.clear()


@pytest.fixture
def config(tiny_model_dir):
    return samples.tiny_vllm_config(tiny_model_dir)


def _lines(caplog_vllm, level: int) -> list[str]:
    """The plugin's own lines at ``level`` (vLLM's loggers propagate on some releases)."""
    return list(
        {
            id(r): r.getMessage()
            for r in caplog_vllm.records
            if r.levelno == level and r.name == LOGGER_NAME
        }.values()
    )


def _warnings(caplog_vllm) -> list[str]:
    return _lines(caplog_vllm, logging.WARNING)


class Selection:
    """vLLM's get_attn_backend_cls contract: the selected backend's path, ValueError when it is
    not valid for the model, the automatic choice for None. Records what it was asked."""

    def __init__(self, valid=None):
        self.valid, self.asked = valid, []

    def __call__(self, selected, *args, **kwargs):
        self.asked.append(selected)
        if selected is None:
            return "auto-selected"
        if self.valid is not None and selected not in self.valid:
            raise ValueError(f"Selected backend {selected} is not valid for this configuration.")
        return selected.get_path()


def _select(selected, environ, select=None, **kwargs):
    select = select or Selection()
    return select_attention_backend(select, selected, "selector", environ=environ, **kwargs)


def test_selects_the_named_backend_where_vllm_passes_none(config, caplog_vllm):
    before = config.attention_config.compute_hash()
    path = _select(None, {ENV_VAR: "ROCM_AITER_FA"})
    assert path == AttentionBackendEnum.ROCM_AITER_FA.get_path()
    assert config.attention_config.backend is None
    assert config.attention_config.compute_hash() == before
    assert _warnings(caplog_vllm) == []
    (info,) = _lines(caplog_vllm, logging.INFO)
    assert "ROCM_AITER_FA selected by VLLM_ATTENTION_BACKEND" in info


@pytest.mark.parametrize("name", list(AttentionBackendEnum.__members__))
def test_every_backend_this_vllm_knows_is_accepted(name):
    assert resolve(name).value is AttentionBackendEnum[name]
    assert resolve(f" {name.lower()} ").value is AttentionBackendEnum[name]
    assert resolve(name).problem is None


@pytest.mark.parametrize("legacy", sorted(LEGACY_NAMES))
def test_legacy_names_start_cleanly(caplog_vllm, legacy):
    """Names launch scripts still carry: the backend they meant where this release has one on
    ROCm, else one WARNING naming the valid names and automatic selection. Never an exception."""
    select = Selection()
    path = _select(None, {ENV_VAR: legacy}, select)
    target = LEGACY_NAMES[legacy]
    if target is not None and target in AttentionBackendEnum.__members__:
        assert select.asked == [AttentionBackendEnum[target]]
        assert path == AttentionBackendEnum[target].get_path()
        assert _warnings(caplog_vllm) == []
    else:
        assert select.asked == [None] and path == "auto-selected"
        (warning,) = _warnings(caplog_vllm)
        assert f"{ENV_VAR}={legacy!r}" in warning and "ROCM_AITER_FA" in warning


@pytest.mark.parametrize("value", ["ROCM_AITER_FAST", "bogus", "flash-attn"])
def test_unknown_names_warn_once_and_keep_automatic_selection(caplog_vllm, value):
    select = Selection()
    for _ in range(3):  # vLLM selects once per kind of attention layer: one WARNING in all
        assert _select(None, {ENV_VAR: value}, select) == "auto-selected"
    assert select.asked == [None] * 3
    (warning,) = _warnings(caplog_vllm)
    assert f"{ENV_VAR}={value!r} is not an attention backend" in warning
    assert "Valid names: " in warning and "ROCM_AITER_FA" in warning


def test_a_huge_value_gives_a_short_warning(caplog_vllm):
    value = "X" * 100_000
    assert _select(None, {ENV_VAR: value}) == "auto-selected"
    (warning,) = _warnings(caplog_vllm)
    assert len(warning) < SHOWN_LIMIT + 150 + len(env_backend._valid_names())
    assert "(100002 characters)" in warning  # the repr's length: the value and its quotes


@pytest.mark.parametrize("value", ["auto", "AUTO", ""])
def test_auto_keeps_automatic_selection(value):
    select = Selection()
    assert _select(None, {ENV_VAR: value}, select) == "auto-selected"
    assert select.asked == [None]


def test_unset_changes_nothing():
    select = Selection()
    backend = AttentionBackendEnum.TRITON_ATTN
    assert _select(backend, {}, select) == backend.get_path()
    assert _select(None, {}, select) == "auto-selected"
    assert select.asked == [backend, None]


def test_a_backend_vllm_passes_wins_and_the_warning_claims_no_flag(caplog_vllm):
    """vLLM passes a backend from --attention-backend or from its own choice for the model
    (Gemma 4's config hook sets TRITON_ATTN): either way it wins, and the WARNING does not claim
    a flag that may never have been given."""
    select = Selection()
    backend = AttentionBackendEnum.TRITON_ATTN
    assert _select(backend, {ENV_VAR: "ROCM_AITER_FA"}, select) == backend.get_path()
    assert select.asked == [backend]
    (warning,) = _warnings(caplog_vllm)
    assert f"{ENV_VAR}=ROCM_AITER_FA is ignored" in warning
    assert "already selects TRITON_ATTN" in warning
    assert "was also given" not in warning


def test_agreeing_flag_and_variable_do_not_warn(caplog_vllm):
    backend = AttentionBackendEnum.ROCM_AITER_FA
    assert _select(backend, {ENV_VAR: "rocm_aiter_fa"}) == backend.get_path()
    assert _warnings(caplog_vllm) == []


def test_agreeing_flag_and_variable_keep_vllms_own_error():
    """When --attention-backend names the variable's backend, vLLM's rejection is vLLM's: the
    variable must not turn the flag's error into a silent fallback."""
    backend = AttentionBackendEnum.FLASH_ATTN
    with pytest.raises(ValueError, match="is not valid"):
        _select(backend, {ENV_VAR: backend.name}, Selection(valid=set()))


def test_a_backend_vllm_rejects_falls_back_to_automatic_selection(caplog_vllm):
    select = Selection(valid=set())
    assert _select(None, {ENV_VAR: "FLASH_ATTN"}, select) == "auto-selected"
    assert select.asked == [AttentionBackendEnum.FLASH_ATTN, None]
    (warning,) = _warnings(caplog_vllm)
    assert f"{ENV_VAR}=FLASH_ATTN is not valid for this model" in warning


def test_a_command_line_backend_vllm_rejects_still_fails():
    """Only what the variable selected falls back: --attention-backend keeps vLLM's error."""
    with pytest.raises(ValueError, match="is not valid"):
        _select(AttentionBackendEnum.FLASH_ATTN, {}, Selection(valid=set()))


def test_a_backend_the_platform_cannot_run_is_never_tried(caplog_vllm):
    select = Selection()
    path = _select(
        None, {ENV_VAR: "CPU_ATTN"}, select, why_not_here=lambda backend: "not a ROCm backend"
    )
    assert path == "auto-selected" and select.asked == [None]
    (warning,) = _warnings(caplog_vllm)
    assert warning.startswith(f"{ENV_VAR}=CPU_ATTN cannot run here (not a ROCm backend)")


def test_a_valid_backend_is_selected_as_named():
    backend = AttentionBackendEnum.ROCM_AITER_FA
    assert _select(None, {ENV_VAR: backend.name}, Selection(valid={backend})) == backend.get_path()


FAKED_PRELUDE = """
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
"""
"""vLLM's real ``RocmPlatform`` and the plugin's in a child process, on a faked gfx942: ``selector``
describes a decoder layer; ``warnings`` collects the plugin's WARNING lines."""

FAKED_GFX942 = (
    FAKED_PRELUDE
    + """
backend = AttentionBackendEnum[NAME]

def outcome(platform):
    try:
        return platform.get_attn_backend_cls(backend, selector)
    except Exception as exc:
        return f"raises {type(exc).__name__}"

with set_current_vllm_config(samples.tiny_vllm_config()):
    # vLLM passes the flag's backend to stock; to the plugin's platform it passes None, the
    # field the variable no longer writes
    plugin = AiterRocmPlatform.get_attn_backend_cls(None, selector)
    report({"stock": outcome(RocmPlatform), "plugin": plugin,
            "auto": RocmPlatform.get_attn_backend_cls(None, selector), "warnings": warnings,
            "arch": RocmPlatform.get_device_capability().as_version_str()})
"""
)


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
