"""The tests run what ships: the plugin is imported from this environment's site-packages, where
``pip install`` put its wheel, never from the checkout, and that copy is the tree under test.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sysconfig
from pathlib import Path

import vllm_rocm_aiter_plugin
from tests.helpers.environment import is_installed_copy
from tests.helpers.subprocess_util import REPO_ROOT, run_child

TREE = Path(REPO_ROOT) / "src" / "vllm_rocm_aiter_plugin"
DIST = "vllm-rocm-aiter-plugin"


def test_the_test_process_imports_the_installed_copy():
    assert is_installed_copy(vllm_rocm_aiter_plugin.__file__), vllm_rocm_aiter_plugin.__file__


def test_a_child_process_started_in_the_checkout_imports_the_installed_copy():
    """What the doctor, the demo and the forward tier start: a new interpreter whose current
    directory is the repository root (``''`` first on its ``sys.path``)."""
    child = run_child(
        "import vllm_rocm_aiter_plugin, sys\n"
        "report({'file': vllm_rocm_aiter_plugin.__file__, 'path0': sys.path[0]})\n"
    )
    assert is_installed_copy(child.result["file"]), child.result


def installed_distribution() -> importlib.metadata.Distribution:
    """The distribution pip installed into site-packages (not a checkout's leftover egg-info on
    ``sys.path``)."""
    (dist,) = (
        d
        for d in importlib.metadata.distributions(path=[sysconfig.get_path("purelib")])
        if d.metadata["Name"] == DIST
    )
    return dist


def test_the_installed_copy_is_the_tree_under_test():
    """Every file of the package tree is installed with the same bytes, and the installation holds
    no module the tree lacks: a stale wheel cannot pass for the code under test."""
    dist = installed_distribution()
    installed = {
        Path(str(f)).relative_to("vllm_rocm_aiter_plugin").as_posix(): Path(
            str(dist.locate_file(f))
        )
        for f in dist.files or ()
        if str(f).startswith("vllm_rocm_aiter_plugin/") and not str(f).endswith(".pyc")
    }
    tree = {
        p.relative_to(TREE).as_posix(): p
        for p in TREE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted(tree) == sorted(installed), (
        "rebuild: bash scripts/nox -s tests installs the wheel"
    )
    differ = [
        name
        for name in tree
        if hashlib.sha256(tree[name].read_bytes()).digest()
        != hashlib.sha256(installed[name].read_bytes()).digest()
    ]
    assert differ == [], f"installed files differ from the tree: {differ}"


def test_the_install_is_not_editable():
    """An editable install (a ``.pth`` or a finder pointing into the checkout) would import the
    checkout; pip records it in ``direct_url.json``."""
    direct_url = json.loads(installed_distribution().read_text("direct_url.json") or "{}")
    assert not direct_url.get("dir_info", {}).get("editable"), direct_url


def test_the_check_can_fail():
    """Control: the checkout's own copy is recognised as not installed."""
    assert not is_installed_copy(str(TREE / "__init__.py"))
    assert os.path.isdir(TREE), TREE
    assert importlib.import_module("vllm_rocm_aiter_plugin") is vllm_rocm_aiter_plugin
