"""What no tool checks of the package's layout (import-linter's contracts in ``pyproject.toml``
check its layers and cycles): every shipped module is reached, the entry-point module holds entry
points only, nothing writes into vLLM."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import pathlib
import subprocess
import sys

import vllm_rocm_aiter_plugin
from tests.helpers.subprocess_util import REPO_ROOT

PACKAGE = pathlib.Path(vllm_rocm_aiter_plugin.__file__).parent


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names, resolved to absolute
    names (relative imports included), at any depth of the file (function bodies too)."""
    names: set[str] = set()
    package = f"vllm_rocm_aiter_plugin{'' if path.parent == PACKAGE else '.diagnostics'}"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def package_import_graph() -> dict[str, set[str]]:
    """Which of the package's modules each of its modules imports (``diagnostics.forward.cases``
    and so on), at any depth (lazy imports included): the runtime and the diagnostics wing."""
    modules = {
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")
    }
    graph = {}
    for module, path in modules.items():
        named = {n.removeprefix("vllm_rocm_aiter_plugin.") for n in imported_modules(path)}
        graph[module] = (named & set(modules)) - {module, "__init__"}
    return graph


def named_by_string(path: pathlib.Path) -> set[str]:
    """The package's modules a string in ``path`` names (vLLM imports a backend or platform by
    its qualified name): each dotted prefix of every ``vllm_rocm_aiter_plugin.`` string."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts = node.value.split(".")
            if parts[0] == "vllm_rocm_aiter_plugin" and all(p.isidentifier() for p in parts):
                names.update(".".join(parts[1:i]) for i in range(2, len(parts) + 1))
    return names


def reached_from_entry_points() -> set[str]:
    """The package's modules that its entry points (vLLM's plugin groups, the console script,
    ``python -m``) reach through imports and qualified names, lazy ones included."""
    dist = importlib.metadata.distribution("vllm-rocm-aiter-plugin")
    roots = {"__init__", "__main__"} | {
        ep.module.removeprefix("vllm_rocm_aiter_plugin").lstrip(".") or "__init__"
        for ep in dist.entry_points
    }
    graph = package_import_graph()
    paths = {
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")
    }
    reached, todo = set(), list(roots)
    while todo:
        module = todo.pop()
        if module in reached or module not in graph:
            continue
        reached.add(module)
        todo += graph[module] | (named_by_string(paths[module]) & set(graph))
    return reached


def test_every_shipped_module_is_reached_from_an_entry_point():
    """What ships is what vLLM or the commands run: a module nothing reaches belongs in tests/,
    benchmarks/ or scripts/ (the import walk is static; ``docs/architecture.md``)."""
    shipped = {
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
    }
    package_markers = {m for m in shipped if m.endswith("__init__") and m != "__init__"}
    assert shipped - package_markers - reached_from_entry_points() == set()
    assert {"builder", "diagnostics.doctor", "diagnostics.forward.runner"} <= (
        reached_from_entry_points()
    )


def test_the_entry_points_module_holds_entry_points_only():
    """``__init__`` names the entry points and the version; what they do is ``registration``."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    assert not [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    assert set(vllm_rocm_aiter_plugin.__all__) == {"__version__", "platform_plugin", "register"}


def writes_into_vllm(source: str) -> list[str]:
    """Assignments to an attribute of a vLLM module or class in ``source``: ``vllm.x.y = ...``,
    ``setattr(vllm..., ...)`` and ``monkeypatch.setattr(vllm..., ...)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [ast.unparse(t) for t in targets
                      if isinstance(t, ast.Attribute) and ast.unparse(t).startswith("vllm.")]  # fmt: skip
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("setattr"):
            owner = ast.unparse(node.args[0]) if node.args else ""
            if owner == "vllm" or owner.startswith(("vllm.", "stock_", "AiterFlash")):
                found.append(ast.unparse(node))
    return found


def test_nothing_mocks_what_ships_or_writes_into_vllm():
    """No ``unittest.mock`` in what ships, and no assignment into a vLLM module or class in what
    ships or in the tests: vLLM is read, never changed."""
    for path in PACKAGE.rglob("*.py"):
        assert "unittest" not in path.read_text(), path
    tests = pathlib.Path(REPO_ROOT) / "tests"
    for path in [*PACKAGE.rglob("*.py"), *tests.rglob("*.py")]:
        assert writes_into_vllm(path.read_text()) == [], path
    assert writes_into_vllm("import vllm\nvllm.platforms._current_platform = 1\n")  # control
    assert writes_into_vllm("monkeypatch.setattr(vllm, '__version__', 'dev')\n")


def _link_distribution_tree(name: str, target: pathlib.Path) -> None:
    """Symlink ``name``'s installed files and those of what it requires into ``target``."""
    from packaging.requirements import Requirement

    dist = importlib.metadata.distribution(name)
    for top in {pathlib.PurePath(str(f)).parts[0] for f in dist.files or ()}:
        if top not in ("..", "__pycache__") and not (target / top).exists():
            (target / top).symlink_to(pathlib.Path(str(dist.locate_file(top))))
    for line in dist.requires or ():
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            _link_distribution_tree(requirement.name, target)


def test_tests_outside_their_environment_say_how_to_run_them_in_one_line(tmp_path):
    """An interpreter whose import path holds pytest and what it requires, and neither torch nor
    vLLM, gets pytest's one usage line."""
    _link_distribution_tree("pytest", tmp_path)
    code = "import sys, pytest; sys.exit(pytest.main(['-p', 'no:cacheprovider', '--collect-only']))"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code],  # -S: no site-packages, so no torch and no vLLM
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    output = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert output == [
        f"ERROR: torch and vllm are not installed in this Python ({sys.executable}): run the "
        "tests with `bash scripts/nox -s tests`, which builds their environments"
    ], output
