"""VLLM_ATTENTION_BACKEND picks only among the backends stock's own automatic selection accepts
for the layer, in its configuration, on this release (plus ROCM_AITER_FA where AITER is found
and supported), on emulated ROCm machines: gfx942, gfx950, gfx90a and gfx1100, with AITER and
without (``tests/emulated_rocm/``, a test-only platform plugin). vLLM's real ``RocmPlatform``
answers for stock and its real ``get_valid_backends`` for what stock accepts; the plugin's
platform class for the plugin. The doctor's verdict is checked against the same selection. One
child per machine (``selection_property.machine``) answers every test of this module."""

from __future__ import annotations

import concurrent.futures
import itertools

import pytest

from tests.helpers import emulated_rocm
from tests.helpers.selection_property import SCENARIO_MACHINES
from tests.helpers.selection_scenarios import DRAFT_BACKEND_FIELD
from tests.helpers.subprocess_util import run_child

MACHINES = list(itertools.product(emulated_rocm.ARCHS, (True, False)))
MI300_CLASS = ("gfx942", "gfx950")


def _machine(arch: str, aiter: bool) -> dict:
    code = f"""
    from tests.helpers.selection_property import machine
    report(machine({arch!r}, {aiter!r}))
    """
    env = {"VLLM_LOGGING_LEVEL": "INFO", **emulated_rocm.env(arch, aiter)}
    return run_child(code, env=env, timeout=900).result


@pytest.fixture(scope="module")
def machines() -> dict:
    """Each machine's answers, two children at a time (each child's work is one core)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {machine: pool.submit(_machine, *machine) for machine in MACHINES}
        return {machine: future.result() for machine, future in futures.items()}


@pytest.fixture(scope="module")
def property_reports(machines) -> dict:
    return {machine: found["property"] for machine, found in machines.items()}


@pytest.mark.parametrize(
    "arch, aiter", MACHINES, ids=[f"{a}-{'aiter' if h else 'no-aiter'}" for a, h in MACHINES]
)
def test_the_plugin_picks_only_what_stock_accepts(property_reports, arch, aiter):
    """For every draw: stock's automatic pick, one of stock's valid candidates for the layer, or
    ROCM_AITER_FA with AITER found and supported; no exception where stock has none; an impl
    that constructs wherever stock's own pick does; a log line naming what the layer got."""
    report = property_reports[arch, aiter]
    assert report.get("failure") is None, report["failure"]
    # the emulation is the machine it says: vLLM's own AITER check sees what was emulated
    assert report["aiter_supported"] is (aiter and arch in MI300_CLASS)
    assert report["kinds"] + len(report["kinds_not_on_this_release"]) == 19
    counts = report["counts"]
    assert counts.get("honoured", 0) > 0 and counts.get("stock's pick", 0) > 0, counts


@pytest.mark.parametrize(
    "arch, aiter", MACHINES, ids=[f"{a}-{'aiter' if h else 'no-aiter'}" for a, h in MACHINES]
)
def test_the_doctor_agrees_with_the_selection_for_every_name(property_reports, arch, aiter):
    """A name honoured for no kind of layer is a PROBLEM (exit 1); for some kinds, a NOTE;
    for every kind, neither."""
    assert property_reports[arch, aiter]["doctor"] == []


@pytest.fixture(scope="module")
def scenarios(machines) -> dict:
    return {machine: machines[machine]["scenarios"] for machine in SCENARIO_MACHINES}


SCENARIO_IDS = [f"{a}-{'aiter' if h else 'no-aiter'}" for a, h in SCENARIO_MACHINES]


def _honoured(case: dict, name: str, aiter_supported: bool) -> bool:
    """What the rule says for ``name`` on a layer stock offers ``case["valid"]``."""
    return name in case["valid"] or (name == "ROCM_AITER_FA" and aiter_supported)


@pytest.mark.parametrize("machine", SCENARIO_MACHINES, ids=SCENARIO_IDS)
def test_aiter_backends_only_where_aiter_is_found_and_supported(scenarios, machine):
    """Defect 1: on a ROCm GPU without AITER (or one AITER does not support), the AITER backends
    the variable names get stock's automatic choice, with a WARNING naming the reason, and the
    layer's impl constructs; with AITER on an MI300 they are honoured."""
    facts = scenarios[machine]
    arch, aiter = machine
    # the emulation is the machine it says: the plugin's platform on that GPU, vLLM's own AITER
    # check seeing what was emulated
    capability = {"gfx942": "9.4", "gfx950": "9.5", "gfx90a": "9.0", "gfx1100": "11.0"}[arch]
    assert (facts["platform"], facts["capability"]) == ("AiterRocmPlatform", capability)
    assert facts["aiter_supported"] is (aiter and arch in MI300_CLASS)
    unimportable = facts["aiter_fa_import_error"]
    for layer in ("decoder", "mla"):
        for name, case in facts[layer].items():
            rejected = name == "ROCM_AITER_FA" and unimportable is not None
            if _honoured(case, name, facts["aiter_supported"]) and not rejected:
                assert case["plugin"] == name, (name, case)
                assert case["constructs"] is None, (name, case)
                continue
            assert case["plugin"] == case["stock"], (name, case)
            (level, line), *_ = case["lines"]
            assert level == "WARNING" and f"{name} is not honoured" in line, line
            if rejected and facts["aiter_supported"]:
                # This release's module imports AITER's package, which needs a ROCm install the
                # emulated machine has not: vLLM's own selection raises, and the plugin falls
                # back to stock's choice, saying why (what an operator whose AITER fails sees).
                assert f"vLLM rejects it for this layer ({unimportable})" in line, line
            if not facts["aiter_supported"]:
                assert "AITER is not found, or not supported on this GPU" in line, line
            assert line.endswith(f"Stock's automatic selection applies: {case['stock']}."), line
    if not facts["aiter_supported"]:  # the reported start failure: the pick constructs
        case = facts["decoder"]["ROCM_AITER_UNIFIED_ATTN"]
        assert case["plugin"] != "ROCM_AITER_UNIFIED_ATTN" and case["constructs"] is None, case


@pytest.mark.parametrize("machine", SCENARIO_MACHINES, ids=SCENARIO_IDS)
def test_encoder_decoder_layers_get_only_what_stock_offers_them(scenarios, machine):
    """Defect 2: ROCM_ATTN (and the legacy names for it) reaches an encoder-decoder model's
    layers only where stock's own selection offers it there (0.33.0 removes it, so that the
    encoder's and decoder's KV layouts match); elsewhere each layer gets stock's choice."""
    facts = scenarios[machine]
    for kind, cases in facts["encoder_decoder"].items():
        for name, case in cases.items():
            if "ROCM_ATTN" in case["valid"]:
                assert case["plugin"] == "ROCM_ATTN", (kind, name, case)
            else:
                assert case["plugin"] == case["stock"] != "ROCM_ATTN", (kind, name, case)
                (level, line), *_ = case["lines"]
                assert level == "WARNING" and "ROCM_ATTN is not honoured" in line, line
    picks = {c["plugin"] for cases in facts["encoder_decoder"].values() for c in cases.values()}
    stock = {c["stock"] for cases in facts["encoder_decoder"].values() for c in cases.values()}
    if not any(
        "ROCM_ATTN" in c["valid"] for cs in facts["encoder_decoder"].values() for c in cs.values()
    ):
        assert picks == stock  # the model's layers are the mix stock builds, never another


@pytest.mark.parametrize("machine", SCENARIO_MACHINES, ids=SCENARIO_IDS)
def test_the_doctor_says_problem_where_nothing_honours_the_name(scenarios, machine):
    """Defect 3: the whole doctor (its other checks answered as healthy) exits 1 with a PROBLEM
    naming the reason where the name is honoured for no kind of layer (AITER missing, say), and
    exits 0 with a NOTE naming the kinds of model that do not get it."""
    facts = scenarios[machine]
    doctor_on = facts["doctor"]
    unified = doctor_on["ROCM_AITER_UNIFIED_ATTN"]
    if not facts["aiter_supported"]:
        assert unified["exit_code"] == 1, unified
        (problem,) = [p for p in unified["problems"] if "VLLM_ATTENTION_BACKEND" in p]
        assert "will not be honoured here" in problem and "AITER is not found" in problem
    else:
        assert unified["exit_code"] == 0 and unified["problems"] == [], unified
    rocm_attn = doctor_on["ROCM_ATTN"]
    assert rocm_attn["exit_code"] == 0 and rocm_attn["problems"] == [], rocm_attn
    refused_for_encoder_decoder = any(
        "ROCM_ATTN" not in c["valid"]
        for cs in facts["encoder_decoder"].values()
        for c in cs.values()
    )
    (note,) = [n for n in rocm_attn["notes"] if n.startswith("VLLM_ATTENTION_BACKEND=ROCM_ATTN:")]
    assert ("encoder-decoder models'" in note.split("not for")[1]) is refused_for_encoder_decoder


@pytest.mark.parametrize("machine", SCENARIO_MACHINES, ids=SCENARIO_IDS)
def test_the_log_says_what_the_layer_got(scenarios, machine):
    """Defect 4 (TurboQuant, 0.33.0): where vLLM's own rule gives a TurboQuant run's boundary
    layer another backend than ROCM_ATTN, the plugin's line says so and names that backend; it
    never says ROCM_ATTN was selected."""
    facts = scenarios[machine]
    if "turboquant_boundary" not in facts:
        pytest.skip("this vLLM release has no TurboQuant KV-cache dtype")
    case = facts["turboquant_boundary"]
    (level, line), *_ = case["lines"]
    if case["plugin"] == "ROCM_ATTN":
        assert level == "INFO" and line.startswith("Attention backend ROCM_ATTN selected"), line
    else:
        assert level == "WARNING" and "ROCM_ATTN is not honoured" in line, line
        assert line.endswith(f"applies: {case['plugin']}."), line
        assert not any("ROCM_ATTN selected" in text for _, text in case["lines"])


@pytest.mark.parametrize("machine", SCENARIO_MACHINES, ids=SCENARIO_IDS)
def test_a_speculative_draft_follows_the_same_rule(scenarios, machine):
    """Item 5, decided: the variable reaches a draft model's layers as it reaches the target's
    (vLLM's own draft config, ``_create_draft_vllm_config`` up to 0.33.0 and
    ``SpeculativeConfig.apply_draft_overrides`` from 0.34.0, gives the draft no backend of its
    own unless the speculative config names one), under the same rule; a backend the
    speculative config names wins, with a WARNING."""
    facts = scenarios[machine]
    unnamed, named = facts["draft"]["unnamed"], facts["draft"].get("ROCM_ATTN")
    assert unnamed["config_backend"] is None
    if "TRITON_ATTN" in facts["decoder_valid"]:
        assert unnamed["path"].endswith("TritonAttentionBackend"), unnamed
        assert unnamed["lines"][0][1].startswith("Attention backend TRITON_ATTN selected"), unnamed
    if named is None:
        pytest.skip(
            f"this vLLM's SpeculativeConfig has no {DRAFT_BACKEND_FIELD!r}: a speculative config "
            "cannot name the draft's backend here (the unnamed draft was checked)"
        )
    assert named["config_backend"] == "ROCM_ATTN" and named["path"].endswith("RocmAttentionBackend")
    (level, line), *_ = named["lines"]
    assert level == "WARNING" and "TRITON_ATTN is ignored" in line and "speculative config" in line
