"""The references' docstrings cite what they rest on. A reference stands for an AITER function;
where it takes a parameter the pinned CPU wheel's function lacks (``sink_ptr`` arrived in AITER
v0.1.10), the sentences that describe that parameter cite another source by repository and
commit or tag, and no sentence that cites the pinned wheel describes it (except to say the wheel
lacks it)."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

from tests.helpers import environment
from tests.helpers.aiter_triton import aiter_root
from vllm_rocm_aiter_plugin.diagnostics.forward import reference_kernels

STANDS_FOR = {
    # reference in reference_kernels: (file in the aiter package, the function it stands for)
    "flash_attn_varlen_func": ("ops/mha.py", "flash_attn_varlen_func"),
    "paged_attention_v1": ("ops/attention.py", "paged_attention_v1"),
    "check_unified_attention": ("ops/triton/unified_attention.py", "unified_attention"),
}
COMMIT_OR_TAG = re.compile(r"\b[0-9a-f]{40}\b|\bv\d+\.\d+(\.\d+)*\b")
SAYS_IT_LACKS = re.compile(r"\b(has no|lacks|without)\b")


def pinned_version() -> str:
    pins = [
        line.split("#", 1)[0].strip()
        for line in environment.AITER_PIN_FILE.read_text().splitlines()
    ]
    (pin,) = [p for p in pins if p]
    return pin.split("==")[1]


def sentences(docstring: str) -> list[str]:
    text = " ".join(docstring.split())
    return [s for s in re.split(r"(?<=\.)\s+(?=[A-Z(`])", text) if s]


def miscitations(docstring: str, lacking: set[str], pinned: str) -> list[str]:
    """The sentences of ``docstring`` that describe a parameter in ``lacking`` and either cite
    no commit or tag, or cite the ``pinned`` wheel without saying it lacks the parameter."""
    found = []
    for sentence in sentences(docstring):
        named = {p for p in lacking if re.search(rf"\b{re.escape(p)}\b", sentence)}
        if not named:
            continue
        if pinned in sentence:
            if not SAYS_IT_LACKS.search(sentence):
                found.append(f"cites amd-aiter {pinned} for {sorted(named)}: {sentence}")
        elif not COMMIT_OR_TAG.search(sentence):
            found.append(f"no commit or tag for {sorted(named)}: {sentence}")
    return found


def pinned_parameters(relative: str, function: str) -> set[str]:
    """The parameters of ``function`` in the installed ``aiter`` package's file, read from its
    source (``aiter`` itself does not import off ROCm)."""
    root = aiter_root()
    assert root is not None
    path = root / relative
    tree = ast.parse(path.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    arguments = node.args
    return {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}


@pytest.mark.parametrize("reference", sorted(STANDS_FOR))
def test_a_parameter_the_pinned_wheel_lacks_is_cited_from_a_source_that_has_it(reference):
    if not environment.pinned_aiter_installed():
        pytest.skip("the pinned amd-aiter wheel is not installed: its signatures cannot be read")
    function = getattr(reference_kernels, reference)
    lacking = set(inspect.signature(function).parameters) - pinned_parameters(
        *STANDS_FOR[reference]
    )
    assert miscitations(function.__doc__ or "", lacking, pinned_version()) == []
    if reference == "flash_attn_varlen_func":
        assert lacking == {"sink_ptr"}  # the parameter this check exists for


def test_the_citation_check_can_fail():
    """Control: a sentence that cites the pinned wheel for ``sink_ptr``, and one that cites
    nothing, are both found; a sentence with a commit, or one saying the wheel lacks it, is not."""
    pinned = "0.1.7.post2.dev18"
    wrong = f"Each call counts ``sink_ptr`` once (``aiter/ops/mha.py``, amd-aiter {pinned})."
    bare = "Each call counts ``sink_ptr`` once."
    right = "Each call counts ``sink_ptr`` once (ROCm/aiter v0.1.10, ``aiter/ops/mha.py``)."
    lacks = f"The pinned CPU wheel, amd-aiter {pinned}, has no ``sink_ptr``."
    assert len(miscitations(f"{wrong} {bare}", {"sink_ptr"}, pinned)) == 2
    assert miscitations(f"{right} {lacks}", {"sink_ptr"}, pinned) == []
