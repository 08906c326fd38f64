"""``VLLM_ATTENTION_BACKEND`` reaches vLLM's backend selection and nothing else: every reader of
``attention_config.backend`` in the installed vLLM's source (found by
:mod:`tests.helpers.attention_config_readers`) reads the value it reads without the plugin, because the
plugin writes no attention-config field. On vLLM's real ``RocmPlatform`` (an emulated MI300X, in a
child process), a DeepSeek V4.1 start with the variable set builds its attention as stock does."""

from __future__ import annotations

import pytest
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from tests.helpers import emulated_rocm, vllm_releases
from tests.helpers.attention_config_readers import installed
from tests.helpers.emulated_rocm import MI300X_CHILD
from tests.helpers.subprocess_util import run_child
from vllm_rocm_aiter_plugin.env_backend import ENV_VAR


def test_the_scan_finds_vllms_own_readers():
    """The scan can fail: vLLM's selector reads the field in every release the plugin supports,
    and so must the scan find it."""
    readers = [a for a in installed("vllm") if not a.writes]
    assert any(
        a.path == "vllm/v1/attention/selector.py" and a.function == "get_attn_backend"
        for a in readers
    ), "\n".join(map(str, readers))


def test_the_plugin_neither_reads_nor_writes_the_field():
    """The installed plugin never touches ``attention_config.backend``: what any vLLM reader of
    it sees is stock's value."""
    assert installed("vllm_rocm_aiter_plugin") == []


NAMES = ("ROCM_AITER_MLA", "ROCM_AITER_FA", "TRITON_MLA", "FLASH_ATTN")

READERS_SEE_STOCK = (
    MI300X_CHILD
    + """
import dataclasses, importlib, os
from tests.helpers.vllm_releases import compile_identity
from vllm_rocm_aiter_plugin import register

register()  # what vLLM's general-plugin loader runs in every process
try:
    model = importlib.import_module("vllm.models.deepseek_v41.amd.model")
except ImportError as exc:
    model = f"{type(exc).__name__}: {exc}"

def dsv4(config):
    try:
        return model._select_dsv4_attn_cls(config).__name__
    except Exception as exc:
        return f"raises {type(exc).__name__}: {exc}"

results = {}
for name in NAMES:
    if name not in AttentionBackendEnum.__members__:
        continue
    os.environ[ENV_VAR] = name  # read at selection, as in a vLLM process that inherits it
    config = samples.tiny_vllm_config()
    before = compile_identity(config.attention_config)
    with set_current_vllm_config(config):
        # vLLM's selector passes the configured backend (None: no --attention-backend)
        selected = AiterRocmPlatform.get_attn_backend_cls(
            config.attention_config.backend, selector)
        result = {"selected": selected,
                  "unchanged": before == compile_identity(config.attention_config),
                  "backend": repr(config.attention_config.backend)}
        if not isinstance(model, str):
            result["dsv4"] = dsv4(config)
            # control: the field as the plugin used to write it (the test can fail)
            written = dataclasses.replace(
                config.attention_config, backend=AttentionBackendEnum[name])
            result["dsv4_field_written"] = dsv4(
                dataclasses.replace(config, attention_config=written))
    results[name] = result
report({"own": sorted(k for k in vars(AiterRocmPlatform) if not k.startswith("__")),
        "results": results, "dsv4_absent": model if isinstance(model, str) else None})
"""
)


@pytest.fixture(scope="module")
def with_the_variable_set():
    """One child on an emulated MI300X runs the plugin's hooks as vLLM runs them, with the
    variable set to each of ``NAMES`` in turn, and 0.33.0's DeepSeek V4.1 attention selection."""
    code = READERS_SEE_STOCK.replace("NAMES", repr(NAMES)).replace("ENV_VAR", repr(ENV_VAR))
    return run_child(code, env=emulated_rocm.env("gfx942", aiter=False)).result


@pytest.mark.parametrize("name", NAMES)
def test_no_reader_sees_the_variable(with_the_variable_set, name):
    """The platform overrides backend selection only, and after selection with the variable set
    the config is unchanged: each reader the scan finds reads stock's value (None here)."""
    if name not in AttentionBackendEnum.__members__:
        pytest.skip(f"vLLM {vllm_releases.release()} has no {name} backend")
    assert with_the_variable_set["own"] == ["get_attn_backend_cls"]
    result = with_the_variable_set["results"][name]
    assert result["unchanged"] and result["backend"] == "None", result


@pytest.mark.parametrize("name", NAMES)
def test_deepseek_v41_starts_as_stock(with_the_variable_set, name):
    """0.33.0's DeepSeek V4.1 attention selection raises ValueError for any backend field that
    is not a DSV4 sparse backend; with the variable set it picks stock's class. The control
    shows what writing the field, as the plugin did before, does to that start."""
    absent = with_the_variable_set["dsv4_absent"]
    if absent is not None:
        # 0.33.0 has the model: its absence there is a broken environment, not a skip
        assert vllm_releases.release() != "0.33.0", absent
        pytest.skip(f"vLLM {vllm_releases.release()} has no DeepSeek V4.1 ROCm model ({absent})")
    if name not in AttentionBackendEnum.__members__:
        pytest.skip(f"vLLM {vllm_releases.release()} has no {name} backend")
    result = with_the_variable_set["results"][name]
    assert result["dsv4"] == "DeepseekV41ROCMAiterMLAAttention", result
    assert result["dsv4_field_written"].startswith("raises ValueError"), result
