"""Check what ``python -m build`` put in DIST against the package tree: ``python scripts/check_dist.py DIST``.

Run by ``bash scripts/nox -s dist`` (``.ci/run``, the release workflow). What is expected comes from
the tree, not from a list: every file under ``src/vllm_rocm_aiter_plugin/`` but bytecode. It checks
- the wheel holds exactly those files, byte for byte, and the sdist holds them too;
- the wheel that the sdist built equals one built straight from the tree, member for member;
- the wheel's version is ``_version.py``'s, it requires nothing, and it declares both vLLM entry
  points and the console script of ``pyproject.toml``.
Prints one line per check; exits 1 naming every difference.
"""

from __future__ import annotations

import email.parser
import glob
import os
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
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    entry_points = members.get(f"{info}/entry_points.txt", b"").decode()
    declared = {f"[{group}]": points for group, points in project["entry-points"].items()}
    declared["[console_scripts]"] = project["scripts"]
    for group, points in declared.items():
        for name, target in points.items():
            if f"{name} = {target}" not in entry_points.split(group, 1)[-1].split("[", 1)[0]:
                problems.append(f"the wheel's {group} lacks {name} = {target}")
    return problems


def build_from_tree(out: str) -> str:
    for stale in glob.glob(os.path.join(ROOT, "build", "lib*")):  # setuptools would ship leftovers
        shutil.rmtree(stale)
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", out, ROOT],
        check=True, capture_output=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
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
    sdist_package = {n[len("src/") :]: d for n, d in in_sdist.items() if n.startswith("src/")}
    extra = sorted(package_in_wheel - set(expected))
    top_level = ("pyproject.toml", "README.md", "LICENSE")
    checks = {
        f"wheel: the tree's {len(expected)} package files, byte for byte, and nothing else": [
            *_differences(expected, in_wheel, "the wheel"),
            *(f"the wheel has {n}, which the tree lacks" for n in extra),
        ],
        f"sdist: the tree's {len(expected)} package files, {', '.join(top_level)}": [
            *_differences(expected, sdist_package, "the sdist"),
            *(f"the sdist lacks {n}" for n in top_level if n not in in_sdist),
        ],
        "metadata: version from _version.py, no requirements, entry points of pyproject.toml": (
            check_metadata(in_wheel)
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
