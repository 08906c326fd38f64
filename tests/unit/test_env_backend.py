"""VLLM_ATTENTION_BACKEND through the function the plugin's ROCm platform calls for backend
selection (``get_attn_backend_cls``): it selects what it names where vLLM passes no backend and
stock's automatic selection accepts it (an ``Offer``), legacy names select what they meant, no
value ever stops a start, and nothing of the VllmConfig is written, so no other reader of
``attention_config.backend`` sees the variable. On vLLM's real ROCm platform (emulated GPUs):
``tests/commands/test_backend_selection.py``."""

from __future__ import annotations

import logging

import pytest
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from tests.helpers import vllm_releases
from vllm_rocm_aiter_plugin import env_backend
from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.env_backend import (
    ENV_VAR,
    LEGACY_NAMES,
    Offer,
    resolve,
    select_attention_backend,
    stock_offer,
    why_not_offered,
)
from vllm_rocm_aiter_plugin.envs import SHOWN_LIMIT
from vllm_rocm_aiter_plugin.log import LOGGER_NAME


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


EVERYTHING = Offer(tuple(AttentionBackendEnum), {}, aiter_supported=True)
"""Stock accepts every backend for the layer: what the variable's parsing is tested under."""


def _select(selected, environ, select=None, offer=EVERYTHING):
    select = select or Selection()
    return select_attention_backend(
        select, selected, "selector", environ=environ, offer=lambda: offer
    )


def test_selects_the_named_backend_where_vllm_passes_none(config, caplog_vllm):
    before = vllm_releases.compile_identity(config.attention_config)
    path = _select(None, {ENV_VAR: "ROCM_AITER_FA"})
    assert path == AttentionBackendEnum.ROCM_AITER_FA.get_path()
    assert config.attention_config.backend is None
    assert vllm_releases.compile_identity(config.attention_config) == before
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
    assert warning.startswith(f"{ENV_VAR}=FLASH_ATTN is not honoured for this layer: vLLM rejects")
    assert warning.endswith("Stock's automatic selection applies: auto-selected.")


def test_a_backend_that_fails_to_validate_never_stops_the_start(caplog_vllm):
    """Whatever vLLM's explicit selection of the variable's backend raises, stock's automatic
    selection applies: stock, ignoring the variable, would never have run that code."""

    def broken(selected, *args):
        if selected is None:
            return "auto-selected"
        raise AttributeError("a backend class without validate_configuration")

    assert _select(None, {ENV_VAR: "TRITON_ATTN"}, broken) == "auto-selected"
    (warning,) = _warnings(caplog_vllm)
    assert "AttributeError: a backend class without validate_configuration" in warning


def test_a_command_line_backend_vllm_rejects_still_fails():
    """Only what the variable selected falls back: --attention-backend keeps vLLM's error."""
    with pytest.raises(ValueError, match="is not valid"):
        _select(AttentionBackendEnum.FLASH_ATTN, {}, Selection(valid=set()))


def test_a_backend_stock_does_not_offer_is_never_tried(caplog_vllm):
    select = Selection()
    offer = Offer((AttentionBackendEnum.TRITON_ATTN,), {}, aiter_supported=False)
    assert _select(None, {ENV_VAR: "CPU_ATTN"}, select, offer) == "auto-selected"
    assert select.asked == [None]
    (warning,) = _warnings(caplog_vllm)
    assert warning == (
        f"{ENV_VAR}=CPU_ATTN is not honoured for this layer: stock's automatic selection does not "
        "offer it for this layer; stock offers this layer TRITON_ATTN. Stock's automatic selection "
        "applies: auto-selected."
    )


def test_nothing_is_offered_where_vllm_cannot_say(caplog_vllm):
    """No offer (a vLLM without ``get_valid_backends``, or one that fails): automatic selection."""
    select = Selection()
    assert _select(None, {ENV_VAR: "TRITON_ATTN"}, select, offer=None) == "auto-selected"
    assert select.asked == [None]
    (warning,) = _warnings(caplog_vllm)
    assert "does not say which backends it selects automatically" in warning


def test_a_layer_vllm_gives_another_backend_is_logged_as_such(caplog_vllm):
    """vLLM's own per-layer rule (TurboQuant's boundary layers) may give another backend than the
    one selected: the log names what the layer got, never the one asked for."""
    triton = AttentionBackendEnum.TRITON_ATTN

    def replaces(selected, *args):
        return triton.get_path()

    assert _select(None, {ENV_VAR: "ROCM_ATTN"}, replaces) == triton.get_path()
    (warning,) = _warnings(caplog_vllm)
    assert "vLLM gave this layer TRITON_ATTN instead" in warning
    assert warning.endswith("applies: TRITON_ATTN.")
    assert _lines(caplog_vllm, logging.INFO) == []


def test_a_valid_backend_is_selected_as_named():
    backend = AttentionBackendEnum.ROCM_AITER_FA
    assert _select(None, {ENV_VAR: backend.name}, Selection(valid={backend})) == backend.get_path()


ROCM_ATTN, AITER_FA = AttentionBackendEnum.ROCM_ATTN, AttentionBackendEnum.ROCM_AITER_FA


@pytest.mark.parametrize("aiter_supported", [True, False])
def test_rocm_aiter_fa_is_the_one_addition_and_only_with_aiter(aiter_supported):
    """Stock offers ROCM_AITER_FA automatically only under VLLM_ROCM_USE_AITER; the variable may
    pick it wherever vLLM finds AITER and supports it, and nowhere else."""
    offer = Offer((ROCM_ATTN,), {}, aiter_supported)
    reason = why_not_offered(AITER_FA, offer)
    assert (reason is None) is aiter_supported
    if reason:
        assert "AITER is not found, or not supported on this GPU" in reason
    unified = AttentionBackendEnum.ROCM_AITER_UNIFIED_ATTN
    assert why_not_offered(unified, offer) is not None  # no other addition, AITER or not


def test_stock_reasons_are_named():
    offer = Offer((ROCM_ATTN,), {AITER_FA: ("head_size not supported",)}, aiter_supported=True)
    reason = why_not_offered(AITER_FA, offer)
    assert (
        reason == "vLLM's automatic selection rejects it for this layer (head_size not supported)"
    )


def test_stock_offer_is_asked_of_vllms_own_method_with_the_selection_arguments():
    """``get_valid_backends`` gets the same arguments ``get_attn_backend_cls`` got, by name, and
    the device capability; its candidates come back in vLLM's priority order."""

    class Platform:
        asked: dict = {}

        @classmethod
        def get_device_capability(cls):
            return "9.4"

        @classmethod
        def get_valid_backends(cls, device_capability, attn_selector_config, num_heads=None):
            cls.asked = {"capability": device_capability, "selector": attn_selector_config,
                         "heads": num_heads}  # fmt: skip
            return [(AITER_FA, 1), (ROCM_ATTN, 0)], {AttentionBackendEnum.TRITON_ATTN: ["no"]}

    def select(selected_backend, attn_selector_config, num_heads=None):
        raise AssertionError("not called")

    offer = stock_offer(Platform, select, "layer", num_heads=8)
    assert Platform.asked == {"capability": "9.4", "selector": "layer", "heads": 8}
    assert offer is not None and offer.valid == (ROCM_ATTN, AITER_FA)
    assert offer.invalid == {AttentionBackendEnum.TRITON_ATTN: ("no",)}
    assert stock_offer(object, select, "layer") is None  # no get_valid_backends: nothing offered


def test_the_doctor_never_passes_a_name_it_could_not_check():
    """Where vLLM's selection served no kind of layer, the doctor's verdict is a PROBLEM that
    says so, never silence."""
    from vllm_rocm_aiter_plugin.diagnostics.backend_choice import judge

    verdict = judge("TRITON_ATTN", [])
    assert verdict.problem is not None and "could not be checked" in verdict.problem
