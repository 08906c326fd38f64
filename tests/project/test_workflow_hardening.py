"""The workflows' hardening, read off their text (no torch, no vLLM, no YAML library needed):
actions pinned by commit, least privilege, no credentials left in checkouts, and no fork code on
the self-hosted GPU runner."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.subprocess_util import REPO_ROOT

pytestmark = pytest.mark.novllm

GITHUB = Path(REPO_ROOT) / ".github"
WORKFLOWS = sorted((GITHUB / "workflows").glob("*.yml"))


def test_there_are_workflows():
    assert {w.name for w in WORKFLOWS} >= {"cpu.yml", "rocm.yml", "release.yml"}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_by_commit_with_its_version_named(workflow):
    uses = re.findall(r"uses:\s*(\S+)(.*)", workflow.read_text())
    assert uses
    for action, rest in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", action), action
        assert re.fullmatch(r"\s+# v\d+(\.\d+)*", rest), f"{action}: no '# vX.Y' after the SHA"


def test_an_update_bot_keeps_the_pins_fresh():
    config = (GITHUB / "dependabot.yml").read_text()
    assert "package-ecosystem: github-actions" in config


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_reads_only_by_default(workflow):
    assert re.search(r"^permissions:\n  contents: read$", workflow.read_text(), re.M)


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_checkouts_keep_no_credentials(workflow):
    text = workflow.read_text()
    checkouts = [m.end() for m in re.finditer(r"uses: actions/checkout@\S+.*\n", text)]
    for end in checkouts:
        block = re.match(r"(\s+with:\n(\s{10,}.*\n)+)?", text[end:]).group(0)
        assert "persist-credentials: false" in block, text[end - 80 : end + 120]


def test_a_forks_pull_request_never_reaches_the_self_hosted_runner():
    text = (GITHUB / "workflows" / "rocm.yml").read_text()
    assert "self-hosted" in text
    guard = (
        "if: github.event_name != 'pull_request' || "
        "github.event.pull_request.head.repo.full_name == github.repository"
    )
    assert guard in text
    assert "pull_request_target" not in text


def test_the_github_release_waits_for_the_package_index():
    text = (GITHUB / "workflows" / "release.yml").read_text()
    assert "needs: [test, package-index]" in text
    assert "skip-existing: true" in text and "attest-build-provenance" in text
