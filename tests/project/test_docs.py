"""What the docs claim: the README for operators, its times from a record, every path they name
there (the generated tables: cog --check in the lint session)."""

from __future__ import annotations

import pytest

from tests.helpers.subprocess_util import REPO_ROOT


def _script(name: str):
    """The module of ``scripts/NAME.py``, imported as the scripts import each other."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(REPO_ROOT) / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


@pytest.mark.novllm
def test_the_readme_is_for_operators_and_links_every_maintainers_page():
    import re
    from pathlib import Path

    readme = (Path(REPO_ROOT) / "README.md").read_text()
    shown = re.sub(r"<!-- \[\[\[cog.*?\]\]\] -->\n", "", readme, flags=re.S)  # hidden
    assert len(shown.splitlines()) <= 160
    for page in ("architecture", "testing", "performance", "releases", "deviations"):
        assert f"docs/{page}.md" in readme


@pytest.mark.novllm
def test_every_time_in_the_readme_comes_from_a_record():
    """A duration in the README stands only inside a cog block (from
    ``benchmarks/results/timings.json``, with its date and machine); one typed by hand fails."""
    import re
    from pathlib import Path

    readme = (Path(REPO_ROOT) / "README.md").read_text()
    outside = re.sub(r"\[\[\[cog.*?\[\[\[end\]\]\]", "", readme, flags=re.S)
    durations = re.findall(
        r"\b\d+(?:[.,\u2013-]\d+)? ?(?:s|sec|seconds|min|minutes|hours?)\b", outside
    )
    assert durations == [], durations
    assert "timed.sentence()" in readme


@pytest.mark.novllm
def test_the_timing_records_hold_no_path_of_the_machine_they_ran_on():
    """A record's command names what a reader runs: paths in the checkout relative, others as
    ``<placeholders>`` (``scripts/timed.py``)."""
    import json
    import re
    from pathlib import Path

    records = json.loads((Path(REPO_ROOT) / "benchmarks/results/timings.json").read_text())
    assert records and not [r for r in records if re.search(r"(^|\s)/", r["command"])]
    shown = _script("timed").shown
    assert shown(["bash", "-c", "cd /tmp/x/clone && bash scripts/nox"], "/repo") == (
        "bash -c cd <clone> && bash scripts/nox"
    )
    assert shown(["/repo/.nox/demo/bin/python", "-m", "m"], "/repo") == ".nox/demo/bin/python -m m"


def test_every_path_and_import_of_this_repository_the_docs_name_exists():
    """A backticked path in a folder of the repository names a file or folder that is there (a
    ``module.name`` reference: its module; a glob is left alone), and what a code block imports
    from the plugin or the tests exists: a doc that points at a moved or removed file fails.
    Other projects' paths (vLLM's ``tests/v1/...``) and history (``git show COMMIT:path``) are
    not in a folder of this repository. (Not ``novllm``: it asks git, which an sdist has not.)"""
    import re
    import subprocess
    from pathlib import Path

    root = Path(REPO_ROOT)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
    tracked = {name: (root / name).read_bytes() for name in listed.stdout.decode().split("\0")
               if name}  # fmt: skip
    folders = {str(p) for t in tracked for p in Path(t).parents} - {"."}
    missing = []
    for doc in (t for t in tracked if t.endswith(".md")):
        text = tracked[doc].decode()
        for path in re.findall(r"`([\w.-]+/[\w./*-]*)", text):
            path = path.rstrip("/.")
            if "*" in path or str(Path(path).parent) not in folders or (root / path).exists():
                continue
            if not (root / f"{path.rsplit('.', 1)[0]}.py").is_file():  # module.name
                missing.append(f"{doc}: {path}")
        pattern = r"^from ((?:vllm_rocm_aiter_plugin|tests)\b[\w.]*) import ([\w, ]+)$"
        for package, names in re.findall(pattern, text, re.M):
            base = root / ("src" if package.startswith("vllm_") else "") / package.replace(".", "/")
            source = next(
                (p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None
            )
            for name in names.replace(" ", "").split(","):
                defined = source and re.search(
                    rf"^(def |class )?{name}\b", source.read_text(), re.M
                )
                if not ((base / f"{name}.py").is_file() or defined):
                    missing.append(f"{doc}: {package}.{name}")
    assert missing == [], missing
