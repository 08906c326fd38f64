"""What the package index shows agrees with what CI checks (no torch, no vLLM needed)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

import pytest

from tests.helpers.subprocess_util import REPO_ROOT

pytestmark = pytest.mark.novllm

try:
    import tomllib
except ImportError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib


def _project() -> dict:
    return tomllib.loads((Path(REPO_ROOT) / "pyproject.toml").read_text())["project"]


def _checked_pythons() -> tuple[str, ...]:
    """``noxfile.PYTHONS``, read without importing nox."""
    tree = ast.parse((Path(REPO_ROOT) / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PYTHONS" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("noxfile.py defines no PYTHONS")


def test_requires_python_and_the_classifiers_name_exactly_the_pythons_ci_checks():
    project, checked = _project(), _checked_pythons()
    classified = [
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert classified == list(checked)
    low, high = checked[0], checked[-1]
    major, minor = high.split(".")
    assert project["requires-python"] == f">={low},<{major}.{int(minor) + 1}"


def test_the_index_page_metadata():
    project = _project()
    assert len(project["description"]) < 120
    assert set(project["urls"]) == {"Homepage", "Documentation", "Changelog", "Issues", "Source"}
    for prefix in ("Development Status ::", "Operating System ::", "Topic ::"):
        assert any(c.startswith(prefix) for c in project["classifiers"]), prefix
    assert project["license"] == "Apache-2.0" and project["authors"]


def test_the_readme_links_absolutely_into_the_repository():
    """The README is the index page's long description: a relative link leads nowhere there.
    (The wheel carries it as its long description.)"""
    readme = (Path(REPO_ROOT) / "README.md").read_text()
    source = _project()["urls"]["Source"]
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links
    relative = [link for link in links if not link.startswith(("https://", "http://"))]
    assert relative == []
    assert any(link.startswith(f"{source}/") for link in links)


def test_the_installed_wheel_requires_nothing_and_declares_what_pyproject_declares():
    """The wheel pip installed here (the dist session's, from the sdist; the suite's): no
    requirement, so that it never replaces an image's vLLM or torch; the version of
    ``_version.py``; the entry points and the console script of ``pyproject.toml``."""
    dist = importlib.metadata.distribution("vllm-rocm-aiter-plugin")
    assert dist.requires is None
    version: dict[str, str] = {}
    exec((Path(REPO_ROOT) / "src/vllm_rocm_aiter_plugin/_version.py").read_text(), version)
    assert dist.version == version["__version__"]
    project = _project()
    groups = {**project["entry-points"], "console_scripts": project["scripts"]}
    declared = {
        (g, name, target) for g, points in groups.items() for name, target in points.items()
    }
    assert {(ep.group, ep.name, ep.value) for ep in dist.entry_points} == declared
