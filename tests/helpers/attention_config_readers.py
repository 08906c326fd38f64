"""Where the installed vLLM's source touches ``attention_config.backend``: read off its syntax
trees, so a new reader in a new release is found without anyone listing it.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass

FIELDS = ("backend", "backend_per_kind")


@dataclass(frozen=True)
class Access:
    path: str  # relative to the vllm package's parent, e.g. vllm/v1/attention/selector.py
    line: int
    function: str  # the enclosing function's qualified name, or <module>
    field: str
    writes: bool

    def __str__(self) -> str:
        kind = "writes" if self.writes else "reads"
        return f"{self.path}:{self.line} {self.function} {kind} {self.field}"


def _is_attention_config(node: ast.expr, aliases: set[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "attention_config"
    return isinstance(node, ast.Name) and node.id in aliases


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path, self.scope = path, ["<module>"]
        self.aliases: list[set[str]] = [set()]
        self.found: list[Access] = []

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.aliases.append(set(self.aliases[-1]))
        self.generic_visit(node)
        self.aliases.pop()
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _function

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Attribute) and node.value.attr == "attention_config":
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.aliases[-1].add(target.id)
        self.generic_visit(node)

    def _record(self, line: int, field: str, writes: bool) -> None:
        function = ".".join(self.scope[1:]) or "<module>"
        self.found.append(Access(self.path, line, function, field, writes))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in FIELDS and _is_attention_config(node.value, self.aliases[-1]):
            self._record(node.lineno, node.attr, isinstance(node.ctx, ast.Store | ast.Del))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id in ("getattr", "setattr")
            and len(node.args) >= 2
            and _is_attention_config(node.args[0], self.aliases[-1])
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in FIELDS
        ):
            self._record(node.lineno, node.args[1].value, func.id == "setattr")
        self.generic_visit(node)


def scan_file(path: str, shown_as: str) -> list[Access]:
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if "attention_config" not in source:  # every access names it (the rules above)
        return []
    tree = ast.parse(source, filename=path)
    scanner = _Scanner(shown_as)
    scanner.visit(tree)
    return scanner.found


def scan_package(package_dir: str) -> Iterator[Access]:
    """Every access under ``package_dir`` (a package's folder), files in sorted order."""
    parent = os.path.dirname(package_dir.rstrip(os.sep))
    for root, dirs, files in os.walk(package_dir):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                yield from scan_file(path, os.path.relpath(path, parent))


def installed(package: str) -> list[Access]:
    """Every access in an installed package's source (by import name), each once."""
    import importlib

    module = importlib.import_module(package)
    return list(dict.fromkeys(scan_package(os.path.dirname(module.__file__ or ""))))
