"""Check the upstream patch (``docs/upstream/*.patch``) against vLLM's own sources and tests."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from xml.etree import ElementTree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "upstream")
PATCHES = os.path.join(ROOT, "docs", "upstream")
SDIST_SHA256 = {
    "0.33.0": "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
    "0.34.0": "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113",
}
CPU_PLUGIN = os.path.join(ROOT, "scripts", "vllm_tests_on_cpu.py")


def say(step: str, ok: bool, detail: str) -> bool:
    print(f"upstream: {'PASS' if ok else 'FAIL'}  {step}: {detail}", flush=True)
    return ok


def index_page(project: str = "vllm") -> str:
    """``project``'s page on the package index pip is configured with (``pip config``: the
    ``index-url`` of any scope, ``PIP_INDEX_URL`` included), else on pip's own default index."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    index = None
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.split(".")[-1] == "index-url":
            index = value.strip().strip("'\"")
    if index is None:
        from pip._internal.models.index import PyPI

        index = PyPI.simple_url
    return index.rstrip("/") + f"/{project}/"


def fetch_sdist(version: str) -> str:
    path = os.path.join(WORK, f"vllm-{version}.tar.gz")
    expected = SDIST_SHA256[version]
    if not os.path.exists(path) or _sha256(path) != expected:
        index = index_page()
        with urllib.request.urlopen(index, timeout=120) as page:
            html = page.read().decode()
        match = re.search(rf'href="([^"]*vllm-{re.escape(version)}\.tar\.gz)[^"]*"', html)
        if match is None:
            raise RuntimeError(f"no vllm-{version}.tar.gz on {index}")
        url = match.group(1)
        if url.startswith("/") or not url.startswith("http"):
            url = urllib.request.urljoin(index, url)
        with urllib.request.urlopen(url, timeout=600) as response, open(path, "wb") as f:
            shutil.copyfileobj(response, f)
    if _sha256(path) != expected:
        raise RuntimeError(f"{path}: sha256 differs from the release's")
    return path


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def make_tree(name: str, sdist: str) -> str:
    """The installed wheel's ``vllm/`` (its compiled parts included) with the sdist's ``tests/``."""
    import vllm

    tree = os.path.join(WORK, name)
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    with tarfile.open(sdist) as archive:
        prefix = archive.getnames()[0].split("/")[0]
        wanted = (f"{prefix}/tests/", f"{prefix}/pyproject.toml")  # vLLM's own pytest config
        members = [m for m in archive.getmembers() if m.name.startswith(wanted)]
        for member in members:
            member.name = member.name[len(prefix) + 1 :]
        archive.extractall(tree, members=members, filter="data")
    # Hard links: the trees share the wheel's files on disk (about 1 GB each as copies).
    shutil.copytree(os.path.dirname(vllm.__file__), os.path.join(tree, "vllm"),
                    copy_function=_link_or_copy)  # fmt: skip
    return tree


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def _own_copy(path: str) -> None:
    """Give ``path`` an inode of its own, so that patching it cannot reach the installed wheel."""
    if os.path.exists(path):
        shutil.copy2(path, path + ".own")
        os.replace(path + ".own", path)


def apply_patch(tree: str, patch: str, *only: str) -> tuple[bool, str]:
    """``git apply`` the patch (or only its files matching ``only``) in ``tree``."""
    # A repository of its own: git apply resolves paths from the repository root.
    subprocess.run(["git", "init", "-q", tree], check=True)
    include = [f"--include={pattern}" for pattern in only]
    check = subprocess.run(
        ["git", "apply", "--check", "--verbose", *include, patch],
        cwd=tree, capture_output=True, text=True,
    )  # fmt: skip
    if check.returncode != 0:
        return False, check.stderr.strip()[-500:]
    files = re.findall(r"^Checking patch (\S+)\.\.\.$", check.stderr, re.M)
    for name in files:
        _own_copy(os.path.join(tree, name))
    subprocess.run(["git", "apply", *include, patch], cwd=tree, check=True)
    return True, f"applies cleanly ({', '.join(files)})"


def vllm_tests(tree: str, tests: list[str], junit: str) -> dict[str, str]:
    """Run vLLM's tests in ``tree`` (its own conftest; global GPU cleanup skipped on CPU);
    outcome per test id."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([tree, os.path.dirname(CPU_PLUGIN)]),
        "VLLM_ROCM_AITER_PLUGIN": "0",
        "HF_HUB_OFFLINE": "1",  # tests that need a model from the hub fail at once, not by timeout
        "TRANSFORMERS_OFFLINE": "1",
    }
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "vllm_tests_on_cpu",
         f"--rootdir={tree}", "--continue-on-collection-errors", f"--junitxml={junit}", *tests],
        cwd=tree, env=env, capture_output=True, text=True, timeout=3600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return {
        f"{classname}::{name}": "skipped (ROCm only)"
        if outcome == "skipped" and "ROCm" in message
        else outcome
        for classname, name, outcome, message in _outcomes(junit)
    }


def _outcomes(junit: str) -> list[tuple[str, str, str, str]]:
    """(classname, name, outcome, message) of each test case of a JUnit report."""
    rows = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        result = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        outcome, message = ("passed", "") if result is None else (result.tag, result.get("message"))
        rows.append((case.get("classname", ""), case.get("name", ""), outcome, message or ""))
    return rows


def in_tree(tree: str, code: str) -> dict:
    """Run ``code`` (which prints one JSON line last) with the tree's vLLM first on sys.path."""
    env = {**os.environ, "PYTHONPATH": tree, "VLLM_ROCM_AITER_PLUGIN": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=1800, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"exited {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}")
    return json.loads(lines[-1])


PROBES = """
import json, vllm
from vllm_rocm_aiter_plugin.diagnostics.probe import probe_stock_split, probe_stock_v2_order
from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm.v1.worker.cp_utils import split_dcp_context_queries
eagle, v2 = probe_stock_split(), probe_stock_v2_order()
batch = samples.v2_order_batch()
dcp = split_dcp_context_queries(batch.query_start_loc_cpu, batch.seq_lens_cpu_upper_bound,
                                batch.max_query_len, batch.num_actual_tokens)
print(json.dumps({"vllm_file": vllm.__file__, "eagle_crash": eagle.affected,
                  "drops_context": v2.affected, "detail": v2.detail,
                  "dcp_decodes_and_context_queries": list(dcp[:2])}))
"""

FORWARD = """
import json
from tests.helpers import forward_child
from vllm_rocm_aiter_plugin.diagnostics.forward import cases  # the checkout is the working directory
from vllm_rocm_aiter_plugin.diagnostics.forward.report import ForwardRequest
request = ForwardRequest(list(cases.CASES), kinds=["stock"])
report = forward_child.run_in_child(forward_child.TierRequest(request, scheduler_steps=True))
print(json.dumps(report.to_json()))
"""


def main(argv: list[str]) -> int:
    import vllm

    version = vllm.__version__
    os.makedirs(WORK, exist_ok=True)
    patches = sorted(p for p in os.listdir(PATCHES) if p.endswith(".patch"))
    if not patches:
        return int(not say("patch", False, f"no *.patch in {PATCHES}"))
    patch = os.path.join(PATCHES, patches[0])
    ok = True

    sdist = fetch_sdist(version)
    stock_tree = make_tree("stock", sdist)
    patched_tree = make_tree("patched", sdist)
    tests_only_tree = make_tree("tests-only", sdist)  # the patch's tests on unpatched vLLM
    applied, detail = apply_patch(patched_tree, patch)
    ok &= say(f"{patches[0]} on vLLM {version}'s sources", applied, detail)
    if not applied:
        return 1

    apply_patch(tests_only_tree, patch, "tests/*")
    tests = ["tests/v1/attention/"]
    # Each check runs in processes of its own: as many at once as the machine has cores
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        forward_run = pool.submit(in_tree, patched_tree, FORWARD)
        runs = {
            name: pool.submit(vllm_tests, tree, tests, os.path.join(WORK, f"junit-{name}.xml"))
            for name, tree in (("stock", stock_tree), ("patched", patched_tree),
                               ("tests-only", tests_only_tree))
        }  # fmt: skip
        probes = [pool.submit(in_tree, tree, PROBES) for tree in (stock_tree, patched_tree)]
    stock, patched = runs["stock"].result(), runs["patched"].result()
    runs_on_cpu = sorted(name for name, outcome in stock.items() if outcome == "passed")
    broken = [name for name in runs_on_cpu if patched.get(name) != "passed"]
    new = sorted(set(patched) - set(stock))
    rocm_only = [name for name in new if patched[name] == "skipped (ROCm only)"]
    new_failing = [name for name in new if patched[name] not in ("passed", "skipped (ROCm only)")]
    ok &= say(
        "vLLM's tests/v1/attention on CPU",
        not broken,
        f"{len(runs_on_cpu)} tests pass on stock {version} here; with the patch "
        f"{len(runs_on_cpu) - len(broken)} of them pass"
        + (f" (broken: {', '.join(broken[:5])})" if broken else ""),
    )
    unfixed = runs["tests-only"].result()
    caught = [name for name in new if patched[name] == "passed" and unfixed.get(name) != "passed"]
    ok &= say(
        "the regression tests on unpatched vLLM",
        bool(caught),
        f"{len(caught)} of the new tests that pass with the fix fail without it "
        f"({', '.join(sorted({n.split('::')[-1].split('[')[0] for n in caught}))})",
    )
    ok &= say(
        "the patch's regression tests",
        bool(new) and not new_failing,
        f"{len(new)} new tests: {len(new) - len(new_failing) - len(rocm_only)} pass on CPU, "
        f"{len(rocm_only)} run on ROCm only (the extend-path correctness test)"
        + (f" ({', '.join(n.split('::')[-1] + ': ' + patched[n] for n in new_failing)})"
           if new_failing else ""),
    )  # fmt: skip

    forward = forward_run.result()
    wrong = {}
    for case in forward["cases"]:
        if case["not_applicable"]:  # a case this release cannot build says why; nothing to judge
            continue
        stock_result = case["outcomes"]["stock"]
        if stock_result["error"]:
            wrong[case["case"]] = stock_result["error"]
            continue
        # On a non-causal batch only the context-free rows can be right: the prefill kernel drops
        # context and the extend path runs causally (docs/upstream/README.md, "Also seen")
        judged = case["configuration"].get("causal", True)
        bad = [
            r["req_id"]
            for r in stock_result["rows"]
            if (judged or not r["context"]) and (r["nan"] or r["error"] > case["tolerance"])
        ]
        more_chunks = isinstance(case["v1_stock_chunks"], int) and (
            stock_result["chunks"] > case["v1_stock_chunks"]
        )
        if bad or more_chunks:
            wrong[case["case"]] = f"wrong {bad}" + (" (more chunks than V1)" if more_chunks else "")
    ok &= say(
        "forward tier, patched stock (plugin off)",
        not wrong,
        f"{len(forward['cases'])} cases, every request equal to the reference"
        if not wrong
        else f"wrong: {wrong}",
    )

    before, after = (probe.result() for probe in probes)
    ok &= say(
        "doctor's probes",
        before["drops_context"] and not after["drops_context"] and after["vllm_file"].startswith(
            patched_tree),
        f"stock {version}: drops context = {before['drops_context']}; patched: "
        f"{after['drops_context']} ({after['detail']})",
    )  # fmt: skip
    say(
        "cp_utils.split_dcp_context_queries on the V2 step (a lead, informational)",
        True,
        f"(decode queries, context queries) stock {before['dcp_decodes_and_context_queries']}, "
        f"patched {after['dcp_decodes_and_context_queries']} of 3 requests, 2 with context",
    )
    print(f"upstream: {'all checks passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
