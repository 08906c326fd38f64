"""Every variable the plugin reads: its parser, what it means, and a problem line for values it
does not understand (the plugin then acts on the default, and says so)."""

from __future__ import annotations

import pytest

from vllm_rocm_aiter_plugin import builder, envs
from vllm_rocm_aiter_plugin.envs import Switch

pytestmark = pytest.mark.cpu

OFF_WORDS = ["0", " 0", "0 ", "false", "FALSE", "off", "no", "disable", "disabled"]
ON_WORDS = ["1", "true", "on", "yes", "auto", "", "enable"]


@pytest.mark.parametrize("value", [None, *ON_WORDS])
def test_kill_switch_on(value):
    reading = envs.parse_switch(value)
    assert reading.value is Switch.AUTO and reading.problem is None


@pytest.mark.parametrize("value", OFF_WORDS)
def test_kill_switch_off(value):
    reading = envs.parse_switch(value)
    assert reading.value is Switch.OFF and reading.problem is None


@pytest.mark.parametrize("value", ["force", "FORCE", " Force "])
def test_kill_switch_force(value):
    assert envs.parse_switch(value).value is Switch.FORCE


@pytest.mark.parametrize("name, parse", [(envs.SWITCH, envs.parse_switch),
                                         (envs.FAST_BUILD, envs.parse_fast_build)])  # fmt: skip
def test_nonsense_is_reported_and_the_default_kept(name, parse):
    reading = parse("garbage")
    assert reading.problem.startswith(f"{name}='garbage' is not understood")
    assert reading.value == parse(None).value


@pytest.mark.parametrize("value", [*OFF_WORDS, *ON_WORDS, "force", "garbage", None])
def test_fast_build_setting_decides_the_own_build_body(monkeypatch, value):
    """What builders created now do: the own body where the release is verified and the variable
    does not turn it off; ``force`` everywhere; nonsense counts as unset (and is reported)."""
    if value is None:
        monkeypatch.delenv(envs.FAST_BUILD, raising=False)
    else:
        monkeypatch.setenv(envs.FAST_BUILD, value)
    setting = envs.parse_fast_build(value).value
    verified = builder.verified_release() is not None
    expected = setting == "force" or (verified and setting == "on")
    assert builder.own_build_enabled() is expected
    assert setting == ("off" if value in OFF_WORDS else "force" if value == "force" else "on")


def test_every_variable_is_documented_and_parses_unset():
    names = [variable.name for variable in envs.VARIABLES]
    assert len(names) == len(set(names))
    for variable in envs.VARIABLES:
        assert variable.doc and variable.owner in ("plugin", "vLLM", "tests")
        reading = variable.read({})
        assert reading.problem is None and reading.meaning


def test_the_plugin_reads_no_variable_outside_the_registry():
    """Every VLLM_*/TORCH_* name in the package's source is one of ``envs.VARIABLES`` (or vLLM's
    own logging stream, which the CLI sets)."""
    import re
    from pathlib import Path

    package = Path(envs.__file__).parent
    known = {variable.name for variable in envs.VARIABLES} | {"VLLM_LOGGING_STREAM"}
    found = set()
    for path in package.rglob("*.py"):
        found |= set(re.findall(r'"(VLLM_[A-Z_]+)"', path.read_text()))
    assert found <= known, sorted(found - known)
