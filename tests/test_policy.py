"""Every branch of the activation policy, decided from plain inputs."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_rocm_aiter_plugin import envs, policy, releases
from vllm_rocm_aiter_plugin.envs import Switch
from vllm_rocm_aiter_plugin.policy import decide_platform, decide_registration

pytestmark = pytest.mark.cpu


def _shifted(version: str, minor: int, patch: int = 0) -> str:
    """A release ``minor`` minors away from ``version`` (any range, no literals)."""
    major, base_minor, _ = releases.version_tuple(version)
    return f"{major}.{base_minor + minor}.{patch}"


OLDEST, NEWEST = releases.OLDEST, releases.NEWEST
BELOW = [_shifted(OLDEST, -1, 1), _shifted(OLDEST, -2), "0.0.1"]
ABOVE = _shifted(NEWEST, 1)

OURS = policy.BACKEND_QUALNAME
STOCK = "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend"
THEIRS = "other_pkg.TheirBackend"


@pytest.mark.parametrize(
    "version, expected",
    [
        ("1.2.3", (1, 2, 3)),
        ("1.2.3+rocm700", (1, 2, 3)),
        ("1.4.1.dev12+gabc", (1, 4, 1)),
        ("1.33", (1, 33, 0)),
        ("v1.20.2", (1, 20, 2)),
        ("dev", None),
    ],
)
def test_parse_version(version, expected):
    assert policy.parse_version(version) == expected


@pytest.mark.parametrize("version", [*releases.TESTED, f"{releases.CI[0]}+rocm700"])
def test_registers_inside_tested_range(version):
    decision = decide_registration(version, Switch.AUTO, STOCK, STOCK)
    assert decision.activate and decision.level == logging.INFO
    assert "PR #44936" in decision.message


@pytest.mark.parametrize("version", BELOW)
def test_refuses_below_minimum(version):
    decision = decide_registration(version, Switch.AUTO, STOCK, STOCK)
    assert not decision.activate and decision.level == logging.WARNING
    assert f"vLLM {version} is older than {OLDEST}" in decision.message
    assert "VLLM_ROCM_AITER_PLUGIN=force" in decision.message


def test_force_overrides_the_minimum():
    decision = decide_registration(BELOW[0], Switch.FORCE, STOCK, STOCK)
    assert decision.activate and decision.level == logging.WARNING


def test_newer_than_tested_registers_with_warning_that_says_how_to_silence():
    decision = decide_registration(ABOVE, Switch.AUTO, STOCK, STOCK)
    assert decision.activate and decision.level == logging.WARNING
    assert (
        f"newer than {NEWEST}" in decision.message
        and "VLLM_ROCM_AITER_PLUGIN=force" in decision.message
    )
    forced = decide_registration(ABOVE, Switch.FORCE, STOCK, STOCK)
    assert forced.activate and forced.level == logging.INFO


@pytest.mark.parametrize("version", [releases.CI[0], BELOW[1], _shifted(NEWEST, 7)])
def test_kill_switch_wins_everywhere(version):
    decision = decide_registration(version, Switch.OFF, STOCK, STOCK)
    assert not decision.activate


def test_keeps_another_packages_override_unless_forced():
    kept = decide_registration(NEWEST, Switch.AUTO, THEIRS, STOCK)
    assert not kept.activate and kept.level == logging.WARNING and THEIRS in kept.message
    forced = decide_registration(NEWEST, Switch.FORCE, THEIRS, STOCK)
    assert forced.activate and f"replacing {THEIRS}" in forced.message


def test_already_ours_is_a_quiet_no_op():
    decision = decide_registration(NEWEST, Switch.AUTO, OURS, STOCK)
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
    import vllm.envs as vllm_envs

    if value is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", value)
    expected = vllm_envs.environment_variables["VLLM_PLUGINS"]()
    assert envs.parse_vllm_plugins(value).value == expected


@given(value=st.lists(st.sampled_from([*"ab ,_\t", "vllm_rocm_aiter_plugin"])).map("".join))
def test_vllm_plugins_parser_matches_vllm_on_any_string(value):
    import os

    import vllm.envs as vllm_envs

    saved = os.environ.get("VLLM_PLUGINS")
    os.environ["VLLM_PLUGINS"] = value
    try:
        expected = vllm_envs.environment_variables["VLLM_PLUGINS"]()
    finally:
        if saved is None:
            del os.environ["VLLM_PLUGINS"]
        else:
            os.environ["VLLM_PLUGINS"] = saved
    reading = envs.parse_vllm_plugins(value)
    assert reading.value == expected
    assert policy.plugin_allowed(reading.value) is (policy.PLUGIN_NAME in expected)
    assert (reading.problem is None) is (policy.PLUGIN_NAME in expected)


def test_tested_range():
    assert policy.in_tested_range(OLDEST) and policy.in_tested_range(f"{NEWEST}+rocm")
    assert not policy.in_tested_range(BELOW[0]) and not policy.in_tested_range(ABOVE)
