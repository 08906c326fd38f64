"""Every variable the plugin reads: its parser, what it means, and a problem line for values it
does not understand (the plugin then acts on the default, and says so)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_rocm_aiter_plugin import builder, envs, policy
from vllm_rocm_aiter_plugin.envs import Switch

OFF_WORDS = ["0", " 0", "0 ", "false", "FALSE", "off", "no", "disable", "disabled"]
ON_WORDS = ["1", "true", "on", "yes", "auto", "", "enable"]


@pytest.mark.parametrize("value", [None, *ON_WORDS])
def test_kill_switch_on(value):
    reading = envs.parse_switch(value)
    assert reading.value is Switch.ON and reading.problem is None


@pytest.mark.parametrize("value", OFF_WORDS)
def test_kill_switch_off(value):
    reading = envs.parse_switch(value)
    assert reading.value is Switch.OFF and reading.problem is None


@pytest.mark.parametrize("value", ["force", "FORCE", " Force "])
def test_kill_switch_force(value):
    assert envs.parse_switch(value).value is Switch.FORCE


@pytest.mark.parametrize("name, parse", [(envs.SWITCH, envs.parse_switch),
                                         (envs.OWN_BUILD, envs.parse_own_build)])  # fmt: skip
def test_nonsense_is_reported_and_the_default_kept(name, parse):
    reading = parse("garbage")
    assert reading.problem.startswith(f"{name}='garbage' is not understood")
    assert reading.value == parse(None).value


@pytest.mark.parametrize("value", [*OFF_WORDS, *ON_WORDS, "force", "garbage", None])
def test_the_own_build_setting_decides_the_default_body(monkeypatch, value):
    """What builders created now do unless told: the own build where the release is verified
    and the variable does not turn it off; ``force`` everywhere; nonsense counts as unset (and
    is reported)."""
    if value is None:
        monkeypatch.delenv(envs.OWN_BUILD, raising=False)
    else:
        monkeypatch.setenv(envs.OWN_BUILD, value)
    setting = envs.parse_own_build(value).value
    verified = builder.verified_release() is not None
    expected = setting is Switch.FORCE or (verified and setting is Switch.ON)
    assert builder.own_build_default() is expected
    assert setting is (
        Switch.OFF if value in OFF_WORDS else Switch.FORCE if value == "force" else Switch.ON
    )


def test_every_variable_is_documented_and_parses_unset():
    names = [variable.name for variable in envs.VARIABLES]
    assert len(names) == len(set(names))
    for variable in envs.VARIABLES:
        assert variable.doc and variable.owner in ("plugin", "vLLM", "tests")
        reading = variable.read({})
        assert reading.problem is None and reading.meaning


def test_the_plugin_reads_no_variable_outside_the_registry():
    """Every VLLM_*/TORCH_* name in the package's source is one of ``envs.VARIABLES`` (or vLLM's
    own logging stream and level, which the CLI sets: the level only while vLLM imports, and only
    where the operator set none)."""
    import re
    from pathlib import Path

    package = Path(envs.__file__).parent
    known = {variable.name for variable in envs.VARIABLES} | {
        "VLLM_LOGGING_STREAM",
        "VLLM_LOGGING_LEVEL",
    }
    found = set()
    for path in package.rglob("*.py"):
        found |= set(re.findall(r'"(VLLM_[A-Z_]+)"', path.read_text()))
    assert found <= known, sorted(found - known)


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


@given(value=st.one_of(st.none(), st.sampled_from(["1", "0", "true", "TRUE", "True", "yes", ""])))
def test_shuffle_layout_parsed_as_the_installed_vllm_does(value):
    """Where the installed vLLM has ``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT``, the plugin reads it as
    vLLM does (the doctor's forward check must run in the layout vLLM serves)."""
    import os

    import vllm.envs as vllm_envs

    vllms = vllm_envs.environment_variables.get(envs.SHUFFLE_LAYOUT)
    if vllms is None:
        pytest.skip("this vLLM has no shuffle KV-cache layout variable")
    saved = os.environ.pop(envs.SHUFFLE_LAYOUT, None)
    if value is not None:
        os.environ[envs.SHUFFLE_LAYOUT] = value
    try:
        expected = vllms()
    finally:
        os.environ.pop(envs.SHUFFLE_LAYOUT, None)
        if saved is not None:
            os.environ[envs.SHUFFLE_LAYOUT] = saved
    assert envs.parse_shuffle_layout(value).value is expected


def test_observe_is_a_value_of_the_switch_only():
    assert envs.parse_switch(" Observe ").value is Switch.OBSERVE
    own_build = envs.parse_own_build("observe")
    assert own_build.value is Switch.ON and own_build.problem
