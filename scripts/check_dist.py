"""Check what ``python -m build`` put in DIST against the package tree.

``python scripts/check_dist.py DIST``; exits 1 naming every difference.
"""

from __future__ import annotations

import email.parser
import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "vllm_rocm_aiter_plugin"
SOURCE = os.path.join(ROOT, "src", PACKAGE)

EXCLUDED = (".gitignore",)
"""Tracked files the sdist leaves out: git's own, which acts on a repository, not on a source tree
(``MANIFEST.in`` includes the rest; the workflows too, whose tests run from the sdist)."""
GENERATED = ("PKG-INFO", "setup.cfg", f"src/{PACKAGE}.egg-info/")
"""What setuptools adds to every sdist."""
LINK = re.compile(r"\]\(([^)\s]+)\)|<a href=\"([^\"]+)\"")


def tracked_files() -> dict[str, bytes]:
    """``{path: bytes}`` of every file git tracks in the checkout but ``EXCLUDED``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode()
    files = {}
    for name in filter(None, listed.split("\0")):
        if not name.startswith(EXCLUDED):
            with open(os.path.join(ROOT, name), "rb") as f:
                files[name] = f.read()
    return files


def tree_files() -> dict[str, bytes]:
    """``{path relative to src/: bytes}`` of every file of the package tree but bytecode."""
    files = {}
    for folder, dirs, names in os.walk(SOURCE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            if not name.endswith((".pyc", ".pyo")):
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, os.path.join(ROOT, "src"))] = f.read()
    return files


def wheel_members(path: str) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as wheel:
        return {name: wheel.read(name) for name in wheel.namelist() if not name.endswith("/")}


def sdist_members(path: str) -> dict[str, bytes]:
    with tarfile.open(path) as sdist:
        members = {}
        for member in sdist.getmembers():
            if member.isfile():
                handle = sdist.extractfile(member)
                assert handle is not None
                members[member.name.split("/", 1)[1]] = handle.read()
        return members


def _differences(expected: dict[str, bytes], found: dict[str, bytes], where: str) -> list[str]:
    problems = [f"{where} lacks {name}" for name in sorted(set(expected) - set(found))]
    problems += [
        f"{where}: {name} differs from the tree"
        for name in sorted(set(expected) & set(found))
        if expected[name] != found[name]
    ]
    return problems


def _version() -> str:
    namespace: dict[str, str] = {}
    with open(os.path.join(SOURCE, "_version.py")) as f:
        exec(f.read(), namespace)
    return namespace["__version__"]


def check_metadata(members: dict[str, bytes]) -> list[str]:
    version = _version()
    info = f"{PACKAGE}-{version}.dist-info"
    if f"{info}/METADATA" not in members:
        return [f"the wheel has no {info}/METADATA (is its version {version}?)"]
    metadata = email.parser.Parser().parsestr(members[f"{info}/METADATA"].decode())
    problems = []
    if metadata["Version"] != version:
        problems.append(f"wheel version {metadata['Version']} != _version.py's {version}")
    if metadata.get_all("Requires-Dist"):
        problems.append(f"the wheel requires {metadata.get_all('Requires-Dist')}; it must not")
    project = _project()
    entry_points = members.get(f"{info}/entry_points.txt", b"").decode()
    declared = {f"[{group}]": points for group, points in project["entry-points"].items()}
    declared["[console_scripts]"] = project["scripts"]
    for group, points in declared.items():
        for name, target in points.items():
            if f"{name} = {target}" not in entry_points.split(group, 1)[-1].split("[", 1)[0]:
                problems.append(f"the wheel's {group} lacks {name} = {target}")
    return problems


def _project() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def check_long_description(members: dict[str, bytes]) -> list[str]:
    """The wheel's long description links only absolutely, into ``[project.urls] Source``."""
    version = _version()
    metadata = email.parser.Parser().parsestr(
        members[f"{PACKAGE}-{version}.dist-info/METADATA"].decode()
    )
    source = _project()["urls"]["Source"]
    problems = []
    for match in LINK.finditer(metadata.get_payload()):
        target = match.group(1) or match.group(2)
        if not target.startswith(("https://", "http://", "mailto:")):
            problems.append(f"the long description links {target!r} relatively")
        elif "github.com" in target and not target.startswith(source):
            problems.append(f"the long description links {target!r}, not under {source}")
    return problems


def build_twice(dist: str) -> list[str]:
    """The sdist and the wheel built again from the tree as the dist session builds them: each
    must equal ``dist``'s byte for byte."""
    if not os.environ.get("SOURCE_DATE_EPOCH"):
        return [
            "SOURCE_DATE_EPOCH is not set: the build is not reproducible (use the dist session)"
        ]
    with tempfile.TemporaryDirectory() as out:
        _build(["--outdir", out, ROOT])
        subprocess.run(
            [sys.executable, os.path.join(ROOT, "scripts", "reproducible_sdist.py"),
             *glob.glob(os.path.join(out, "*.tar.gz"))],
            check=True, capture_output=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        problems = []
        for first in sorted(
            glob.glob(os.path.join(dist, "*.whl")) + glob.glob(os.path.join(dist, "*.tar.gz"))
        ):
            second = os.path.join(out, os.path.basename(first))
            with open(first, "rb") as a, open(second, "rb") as b:
                if a.read() != b.read():
                    problems.append(f"{os.path.basename(first)} differs between two builds")
        return problems


def _build(args: list[str]) -> None:
    for stale in glob.glob(os.path.join(ROOT, "build", "lib*")):  # setuptools would ship leftovers
        shutil.rmtree(stale)
    subprocess.run(
        [sys.executable, "-m", "build", *args], check=True, capture_output=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def build_from_tree(out: str) -> str:
    _build(["--wheel", "--outdir", out, ROOT])
    (wheel,) = glob.glob(os.path.join(out, "*.whl"))
    return wheel


def main(argv: list[str]) -> int:
    (dist,) = argv
    (wheel,) = glob.glob(os.path.join(dist, "*.whl"))
    (sdist,) = glob.glob(os.path.join(dist, "*.tar.gz"))
    expected = tree_files()
    in_wheel = wheel_members(wheel)
    in_sdist = sdist_members(sdist)
    package_in_wheel = {n for n in in_wheel if n.startswith(f"{PACKAGE}/")}
    extra = sorted(package_in_wheel - set(expected))
    tracked = tracked_files()
    generated = [n for n in in_sdist if n.startswith(GENERATED)]
    sdist_extra = sorted(set(in_sdist) - set(tracked) - set(generated))
    checks = {
        f"wheel: the tree's {len(expected)} package files, byte for byte, and nothing else": [
            *_differences(expected, in_wheel, "the wheel"),
            *(f"the wheel has {n}, which the tree lacks" for n in extra),
        ],
        f"sdist: the {len(tracked)} tracked files but {', '.join(EXCLUDED)}, byte for byte, "
        f"and {len(generated)} generated by setuptools": [
            *_differences(tracked, in_sdist, "the sdist"),
            *(f"the sdist has {n}, which git does not track" for n in sdist_extra),
        ],
        "metadata: version from _version.py, no requirements, entry points of pyproject.toml": (
            check_metadata(in_wheel)
        ),
        "long description: no relative link; repository links under [project.urls] Source": (
            check_long_description(in_wheel)
        ),
    }
    with tempfile.TemporaryDirectory() as out:
        from_tree = wheel_members(build_from_tree(out))
    checks["the sdist builds the same wheel as the tree, member for member"] = [
        *(f"only the wheel from the sdist has {n}" for n in sorted(set(in_wheel) - set(from_tree))),
        *(f"only the wheel from the tree has {n}" for n in sorted(set(from_tree) - set(in_wheel))),
        *(
            f"{n} differs between the two wheels"
            for n in sorted(set(in_wheel) & set(from_tree))
            if in_wheel[n] != from_tree[n]
        ),
    ]
    checks[
        f"reproducible: a second build (SOURCE_DATE_EPOCH={os.environ.get('SOURCE_DATE_EPOCH')}) "
        "gives the same bytes"
    ] = build_twice(dist)
    failed = False
    for title, problems in checks.items():
        print(f"dist: {'PASS' if not problems else 'FAIL'}  {title}")
        for problem in problems:
            print(f"        {problem}")
        failed = failed or bool(problems)
    print(f"dist: {os.path.basename(wheel)}, {os.path.basename(sdist)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
