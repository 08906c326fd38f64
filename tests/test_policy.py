"""Every branch of the activation policy, decided from plain inputs."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_rocm_aiter_plugin import policy
from vllm_rocm_aiter_plugin.policy import Switch, decide_platform, decide_registration, parse_switch

pytestmark = pytest.mark.cpu

OURS = policy.BACKEND_QUALNAME
STOCK = "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend"
THEIRS = "other_pkg.TheirBackend"


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, Switch.AUTO),
        ("", Switch.AUTO),
        ("1", Switch.AUTO),
        ("auto", Switch.AUTO),
        ("0", Switch.OFF),
        ("false", Switch.OFF),
        ("OFF", Switch.OFF),
        (" no ", Switch.OFF),
        ("force", Switch.FORCE),
        ("FORCE", Switch.FORCE),
    ],
)
def test_parse_switch(value, expected):
    assert policy.parse_switch(value) == (expected, None)


def test_parse_switch_rejects_nonsense_loudly():
    switch, problem = policy.parse_switch("maybe")
    assert switch is Switch.AUTO and "VLLM_ROCM_AITER_PLUGIN='maybe' is not understood" in problem


@pytest.mark.parametrize(
    "version, expected",
    [
        ("0.23.0", (0, 23, 0)),
        ("0.23.0+rocm700", (0, 23, 0)),
        ("0.24.1.dev12+gabc", (0, 24, 1)),
        ("0.33", (0, 33, 0)),
        ("v0.20.2", (0, 20, 2)),
        ("dev", None),
    ],
)
def test_parse_version(version, expected):
    assert policy.parse_version(version) == expected


@pytest.mark.parametrize("version", ["0.20.0", "0.23.0", "0.23.0+rocm700", "0.33.0"])
def test_registers_inside_tested_range(version):
    decision = decide_registration(version, Switch.AUTO, STOCK, STOCK)
    assert decision.activate and decision.level == logging.INFO
    assert "PR #44936" in decision.message


@pytest.mark.parametrize("version", ["0.19.1", "0.18.0", "0.9.2"])
def test_refuses_below_minimum(version):
    decision = decide_registration(version, Switch.AUTO, STOCK, STOCK)
    assert not decision.activate and decision.level == logging.WARNING
    assert f"vLLM {version} is older than 0.20.0" in decision.message
    assert "VLLM_ROCM_AITER_PLUGIN=force" in decision.message


def test_force_overrides_the_minimum():
    decision = decide_registration("0.19.1", Switch.FORCE, STOCK, STOCK)
    assert decision.activate and decision.level == logging.WARNING


def test_newer_than_tested_registers_with_warning_that_says_how_to_silence():
    decision = decide_registration("0.34.0", Switch.AUTO, STOCK, STOCK)
    assert decision.activate and decision.level == logging.WARNING
    assert (
        "newer than 0.33.0" in decision.message
        and "VLLM_ROCM_AITER_PLUGIN=force" in decision.message
    )
    forced = decide_registration("0.34.0", Switch.FORCE, STOCK, STOCK)
    assert forced.activate and forced.level == logging.INFO


@pytest.mark.parametrize("version", ["0.23.0", "0.19.0", "0.40.0"])
def test_kill_switch_wins_everywhere(version):
    decision = decide_registration(version, Switch.OFF, STOCK, STOCK)
    assert not decision.activate


def test_keeps_another_packages_override_unless_forced():
    kept = decide_registration("0.23.0", Switch.AUTO, THEIRS, STOCK)
    assert not kept.activate and kept.level == logging.WARNING and THEIRS in kept.message
    forced = decide_registration("0.23.0", Switch.FORCE, THEIRS, STOCK)
    assert forced.activate and f"replacing {THEIRS}" in forced.message


def test_already_ours_is_a_quiet_no_op():
    decision = decide_registration("0.23.0", Switch.AUTO, OURS, STOCK)
    assert decision.activate and decision.level == logging.DEBUG


def test_unparsable_version_needs_force():
    assert not decide_registration("weird", Switch.AUTO, STOCK, STOCK).activate
    assert decide_registration("weird", Switch.FORCE, STOCK, STOCK).activate


def test_platform_decisions():
    assert decide_platform(Switch.AUTO, True, []).activate
    assert not decide_platform(Switch.AUTO, False, []).activate
    assert not decide_platform(Switch.OFF, True, []).activate
    other = decide_platform(Switch.AUTO, True, ["neuron_plugin"])
    assert (
        not other.activate and other.level == logging.WARNING and "neuron_plugin" in other.message
    )


ALLOWLISTS = [
    None,
    "vllm_rocm_aiter_plugin",
    "a,vllm_rocm_aiter_plugin",
    "a, vllm_rocm_aiter_plugin",  # vLLM does not strip: " vllm_rocm_aiter_plugin" is not us
    " vllm_rocm_aiter_plugin",
    "a,b",
    "",
]


@pytest.mark.parametrize("value", ALLOWLISTS)
def test_vllm_plugins_parsed_as_the_installed_vllm_does(monkeypatch, value):
    """The plugin's parser against vLLM's own (``vllm.envs``), value by value."""
    import vllm.envs as envs

    if value is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", value)
    assert policy.parse_vllm_plugins(value) == envs.environment_variables["VLLM_PLUGINS"]()


@given(value=st.lists(st.sampled_from([*"ab ,_\t", "vllm_rocm_aiter_plugin"])).map("".join))
def test_vllm_plugins_parser_matches_vllm_on_any_string(value):
    import os

    import vllm.envs as envs

    saved = os.environ.get("VLLM_PLUGINS")
    os.environ["VLLM_PLUGINS"] = value
    try:
        expected = envs.environment_variables["VLLM_PLUGINS"]()
    finally:
        if saved is None:
            del os.environ["VLLM_PLUGINS"]
        else:
            os.environ["VLLM_PLUGINS"] = saved
    parsed = policy.parse_vllm_plugins(value)
    assert parsed == expected
    assert policy.plugin_allowed(parsed) is (policy.PLUGIN_NAME in expected)


SWITCH_VALUES = ["0", " 0", "0 ", "false", "FALSE", "off", "no", "disable", "disabled", "1", "true",
                 "on", "yes", "auto", "force", "", "maybe"]  # fmt: skip


@pytest.mark.parametrize("value", SWITCH_VALUES)
def test_kill_switch_and_fast_build_switch_share_one_vocabulary(monkeypatch, value):
    """A value that turns the plugin off also turns its own build path off, and no other."""
    from vllm_rocm_aiter_plugin import own_build

    off = parse_switch(value)[0] is Switch.OFF
    assert policy.switched_off(value) is off
    monkeypatch.setenv(own_build.FAST_BUILD_ENV, value)
    if own_build.verified_release() is not None:
        assert own_build.enabled() is not off


def test_tested_range():
    assert policy.in_tested_range("0.20.0") and policy.in_tested_range("0.33.0+rocm")
    assert not policy.in_tested_range("0.19.1") and not policy.in_tested_range("0.34.0")
