"""VLLM_ATTENTION_BACKEND onto a real VllmConfig, as the plugin's ROCm platform applies it."""

from __future__ import annotations

import logging

import pytest
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.env_backend import (
    ENV_VAR,
    apply_env_attention_backend,
    parse_backend_name,
)

pytestmark = pytest.mark.cpu


@pytest.fixture
def config(tiny_model_dir):
    """A fresh VllmConfig per test (the function writes to its attention config)."""
    return samples.tiny_vllm_config(tiny_model_dir)


def test_selects_the_named_backend_when_no_flag_was_given(config):
    assert config.attention_config.backend is None
    selected = apply_env_attention_backend(config, {ENV_VAR: "ROCM_AITER_FA"})
    assert selected is AttentionBackendEnum.ROCM_AITER_FA
    assert config.attention_config.backend is AttentionBackendEnum.ROCM_AITER_FA


@pytest.mark.parametrize("name", [m.name for m in AttentionBackendEnum])
def test_every_backend_vllm_knows_is_accepted(name):
    assert parse_backend_name(name) is AttentionBackendEnum[name]
    assert parse_backend_name(f" {name.lower()} ") is AttentionBackendEnum[name]


def test_unknown_name_is_rejected_with_the_valid_ones():
    with pytest.raises(ValueError) as info:
        parse_backend_name("ROCM_AITER_FAST")
    message = str(info.value)
    assert "VLLM_ATTENTION_BACKEND='ROCM_AITER_FAST' is not an attention backend" in message
    assert "ROCM_AITER_FA" in message and "FLASH_ATTN" in message


@pytest.mark.parametrize("value", ["auto", "AUTO", ""])
def test_auto_keeps_automatic_selection(config, value):
    assert apply_env_attention_backend(config, {ENV_VAR: value}) is None
    assert config.attention_config.backend is None


def test_unset_changes_nothing(config):
    assert apply_env_attention_backend(config, {}) is None
    assert config.attention_config.backend is None


def test_command_line_wins_and_a_warning_says_so(config, caplog_vllm):
    config.attention_config.backend = AttentionBackendEnum.TRITON_ATTN  # --attention-backend
    selected = apply_env_attention_backend(config, {ENV_VAR: "ROCM_AITER_FA"})
    assert selected is AttentionBackendEnum.TRITON_ATTN
    assert config.attention_config.backend is AttentionBackendEnum.TRITON_ATTN
    warnings = {id(r): r for r in caplog_vllm.records if r.levelno == logging.WARNING}
    assert len(warnings) == 1
    assert (
        "--attention-backend TRITON_ATTN was also given and wins"
        in next(iter(warnings.values())).getMessage()
    )


def test_agreeing_flag_and_variable_do_not_warn(config, caplog_vllm):
    config.attention_config.backend = AttentionBackendEnum.ROCM_AITER_FA
    assert (
        apply_env_attention_backend(config, {ENV_VAR: "rocm_aiter_fa"})
        is AttentionBackendEnum.ROCM_AITER_FA
    )
    assert not [r for r in caplog_vllm.records if r.levelno >= logging.WARNING]
