"""Every branch of the activation policy, decided from plain inputs (no torch, no vLLM)."""

from __future__ import annotations

import pytest

from vllm_rocm_aiter_plugin import envs, policy, releases
from vllm_rocm_aiter_plugin.envs import Switch
from vllm_rocm_aiter_plugin.policy import decide_platform, decide_registration

pytestmark = pytest.mark.novllm


def _shifted(version: str, minor: int, patch: int = 0) -> str:
    """A release ``minor`` minors away from ``version`` (any range, no literals)."""
    major, base_minor, _ = releases.parse(version)
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
    assert releases.parse(version) == expected


@pytest.mark.parametrize("version", [*releases.TESTED, f"{releases.CI[0]}+rocm700"])
def test_registers_inside_tested_range(version):
    decision = decide_registration(version, Switch.ON, STOCK, STOCK)
    assert decision.activate and decision.level == "INFO"
    assert "PR #44936" in decision.message


@pytest.mark.parametrize("version", BELOW)
def test_refuses_below_minimum(version):
    decision = decide_registration(version, Switch.ON, STOCK, STOCK)
    assert not decision.activate and decision.level == "WARNING"
    assert f"vLLM {version} is older than {OLDEST}" in decision.message
    assert "VLLM_ROCM_AITER_PLUGIN=force" in decision.message


def test_force_overrides_the_minimum():
    decision = decide_registration(BELOW[0], Switch.FORCE, STOCK, STOCK)
    assert decision.activate and decision.level == "WARNING"


def test_newer_than_tested_registers_with_warning_that_says_how_to_silence():
    decision = decide_registration(ABOVE, Switch.ON, STOCK, STOCK)
    assert decision.activate and decision.level == "WARNING"
    assert (
        f"newer than {NEWEST}" in decision.message
        and "VLLM_ROCM_AITER_PLUGIN=force" in decision.message
    )
    forced = decide_registration(ABOVE, Switch.FORCE, STOCK, STOCK)
    assert forced.activate and forced.level == "INFO"


@pytest.mark.parametrize("version", [releases.CI[0], BELOW[1], _shifted(NEWEST, 7)])
def test_kill_switch_wins_everywhere(version):
    decision = decide_registration(version, Switch.OFF, STOCK, STOCK)
    assert not decision.activate


def test_keeps_another_packages_override_unless_forced():
    kept = decide_registration(NEWEST, Switch.ON, THEIRS, STOCK)
    assert not kept.activate and kept.level == "WARNING" and THEIRS in kept.message
    forced = decide_registration(NEWEST, Switch.FORCE, THEIRS, STOCK)
    assert forced.activate and f"replacing {THEIRS}" in forced.message


def test_already_ours_is_a_quiet_no_op():
    decision = decide_registration(NEWEST, Switch.ON, OURS, STOCK)
    assert decision.activate and decision.level == "DEBUG"


@pytest.mark.parametrize("version", ["dev", "weird", "x" * 100_000])
def test_unparsable_version_needs_force_and_says_so(version):
    """A source build reports ``dev``: the refusal names that version, short, and the way to take
    the fix anyway."""
    decision = decide_registration(version, Switch.ON, STOCK, STOCK)
    assert not decision.activate and decision.level == "WARNING"
    assert "cannot be parsed" in decision.message
    assert "VLLM_ROCM_AITER_PLUGIN=force to take the fix anyway" in decision.message
    assert len(decision.message) < envs.SHOWN_LIMIT + 300
    assert decide_registration(version, Switch.FORCE, STOCK, STOCK).activate


PRE_RELEASE_SUFFIXES = ["rc1", "a2", "b1", ".dev3+g1234abc", "rc2.dev161+g5f9d11b.rocm700"]


@pytest.mark.parametrize("suffix", PRE_RELEASE_SUFFIXES)
@pytest.mark.parametrize("release", [OLDEST, releases.CI[0], NEWEST])
def test_a_pre_release_counts_as_tested_only_with_a_verified_build(release, suffix):
    """PEP 440 orders ``0.33.0rc1`` before 0.33.0: only a verified ``build()`` fingerprint makes
    it count as its release; otherwise it is untested, with the WARNING of its place in the range
    (below the oldest release: stock; inside or above: the fix, with a WARNING)."""
    version = f"{release}{suffix}"
    assert releases.is_pre_release(version)
    verified = decide_registration(version, Switch.ON, STOCK, STOCK, build_verified=True)
    assert verified.activate and verified.level == "INFO"
    assert policy.in_tested_range(version, build_verified=True)
    assert not policy.in_tested_range(version, build_verified=False)
    untested = decide_registration(version, Switch.ON, STOCK, STOCK, build_verified=False)
    assert untested.level == "WARNING"
    if release == OLDEST:
        assert not untested.activate and f"older than {OLDEST}" in untested.message
    else:
        assert untested.activate and "untested" in untested.message
        assert "VLLM_ROCM_AITER_PLUGIN=force" in untested.message


@pytest.mark.parametrize(
    "version", [f"{NEWEST}+rocm700", f"{NEWEST}.post1", NEWEST, f"v{OLDEST}", "0.33"]
)
def test_releases_local_builds_and_post_releases_are_not_pre_releases(version):
    assert not releases.is_pre_release(version)


def test_platform_decisions():
    assert decide_platform(Switch.ON, True, []).activate
    assert not decide_platform(Switch.ON, False, []).activate
    assert not decide_platform(Switch.OFF, True, []).activate
    other = decide_platform(Switch.ON, True, ["neuron_plugin"])
    assert not other.activate and other.level == "WARNING" and "neuron_plugin" in other.message


def test_tested_range():
    assert policy.in_tested_range(OLDEST) and policy.in_tested_range(f"{NEWEST}+rocm")
    assert not policy.in_tested_range(BELOW[0]) and not policy.in_tested_range(ABOVE)


@pytest.mark.parametrize("version", [NEWEST, ABOVE])
def test_observe_takes_stocks_backend_with_a_counting_builder_and_says_so(version):
    decision = decide_registration(version, Switch.OBSERVE, STOCK, STOCK)
    assert decision.activate and decision.backend == policy.OBSERVING_QUALNAME
    assert decision.level == "WARNING" and "serves stock vLLM's output" in decision.message
    kept = decide_registration(version, Switch.OBSERVE, THEIRS, STOCK)
    assert not kept.activate and "counts nothing there" in kept.message
    assert not decide_platform(Switch.OBSERVE, True, []).activate  # stock's own selection
    assert decide_registration(version, Switch.ON, STOCK, STOCK).backend == OURS
