"""Every workload of the built-in suites is taken by a special rule (none by the serial fallback), builds for
the H100, and gets a finite carver estimate: what ``schedlib compare --suite NAME`` runs."""

from __future__ import annotations

import math

import pytest

import schedlib as sl
import schedlib.rules as rules
from schedlib import carver
from schedlib.suites import SUITES, suite

CASES = [(name, spec) for name in SUITES for spec in suite(name)]


@pytest.mark.parametrize("name, spec", CASES, ids=[f"{n}:{s.label}" for n, s in CASES])
def test_a_builtin_workload_gets_a_special_rule(name: str, spec: sl.suites.WorkloadSpec) -> None:
    func = spec.build()
    rule = rules.find_rule(func, "h100")
    assert rule.name != "fallback", rules.explain(func, "h100")
    kernel = sl.build(rules.apply_default(func, "h100"), "h100")
    assert kernel.launch
    estimate = carver.estimate(func, "h100", rule.default_config(func, "h100"), rule=rule)
    assert math.isfinite(float(estimate["est_time_us"])) and float(estimate["est_time_us"]) > 0


def test_the_decoder_suite_has_quantised_decode_projections() -> None:
    labels = {s.label: s for s in suite("llm-decoder")}
    for batch in (1, 8):
        spec = labels[f"decode{batch}.down_proj.int8"]
        func = spec.build()
        assert func.buffer("W").dtype == "int8" and rules.find_rule(func, "h100").name == "gemv"


def test_the_decoder_suite_covers_projections_norm_and_softmax_in_each_phase() -> None:
    labels = {s.label for s in suite("llm-decoder")}
    for phase in ("prefill", "decode1", "decode8"):
        for part in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "rmsnorm", "attn_softmax"):
            assert f"{phase}.{part}" in labels
    softmax = {s.label: s for s in suite("llm-decoder")}["decode8.attn_softmax"].build()
    assert rules.find_rule(softmax, "h100").name != "fallback"
