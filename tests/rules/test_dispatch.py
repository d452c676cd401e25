"""Dispatch: ``apply_default`` / ``find_rule`` / ``explain`` / ``get_rule``, errors in a rule, config validation."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import schedlib as sl
import schedlib.hw
import schedlib.rules as rules
from schedlib import workloads as wl
from schedlib.ir.func import Func

from .helpers import check_schedule

ORDER = ["matmul", "gemv", "general_reduction", "reduction", "transpose", "elementwise", "fallback"]


def stencil(n: int = 40) -> Func:
    """``B[i, j] = A[i, j] + A[i, j + 1]``: element-wise in shape, but one load is at a shifted index."""
    A = sl.placeholder((n, n), "float32", "A")
    B = sl.compute((n, n - 1), lambda i, j: A[i, j] + A[i, j + 1], "B")
    return sl.func([A, B], "stencil")


def crossed_rows(rows: int = 8, cols: int = 20) -> Func:
    """``O[i] = sum_k X[i, k] * Y[k, i]``: a row reduction whose operands walk the axes in different orders."""
    X = sl.placeholder((rows, cols), "float32", "X")
    Y = sl.placeholder((cols, rows), "float32", "Y")
    k = sl.reduce_axis(cols, "k")
    O = sl.compute((rows,), lambda i: sl.sum(X[i, k] * Y[k, i], axis=k), "O")
    return sl.func([X, Y, O], "crossed_rows")


def triple_product_matmul(m: int = 12, n: int = 10, kk: int = 9) -> Func:
    """``O[i, j] = sum_k A[i, k] * B[k, j] * S[i, k]``: matmul-shaped, but three operands."""
    A = sl.placeholder((m, kk), "float32", "A")
    B = sl.placeholder((kk, n), "float32", "B")
    S = sl.placeholder((m, kk), "float32", "S")
    k = sl.reduce_axis(kk, "k")
    O = sl.compute((m, n), lambda i, j: sl.sum(A[i, k] * B[k, j] * S[i, k], axis=k), "O")
    return sl.func([A, B, S, O], "triple_mm")


def declines(text: str) -> dict[str, str]:
    """``explain`` output -> {rule: its line}."""
    out = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.strip().partition(": ")
        out[name] = rest
    return out


def test_rules_registry() -> None:
    assert [r.name for r in rules.RULES] == ORDER
    for name in ORDER:
        assert rules.get_rule(name).name == name
    with pytest.raises(KeyError, match="no rule named 'nope'"):
        rules.get_rule("nope")


@pytest.mark.parametrize("make, reasons", [
    (stencil, {"matmul": "needs exactly one reduction block, found 0",
               "transpose": "not a plain copy", "elementwise": "not element-wise"}),
    (crossed_rows, {"matmul": "S..SR", "gemv": "S..SR", "general_reduction": "element-wise output",
                    "reduction": "different axis orders: (i, k), (k, i)", "elementwise": "not element-wise"}),
    (triple_product_matmul, {"matmul": "does not reduce a product of two loads",
                             "gemv": "reduces a product of 3 loads indexed by k, not two",
                             "reduction": "reads no operand at all of its axes ['i', 'j', 'k']"}),
], ids=["stencil", "crossed-rows", "triple-product-matmul"])
def test_explain_falls_back_with_reasons(make, reasons: dict[str, str], rng: np.random.Generator,
                                         toolchain: None) -> None:
    func = make()
    text = rules.explain(func, "h100")
    assert text.splitlines()[0] == f"func {func.name} on h100:"
    lines = declines(text)
    assert list(lines) == ORDER, text
    for name in ORDER[:-1]:
        assert lines[name].startswith("declined: "), text
        assert len(lines[name]) > len("declined: ") + 10, f"{name} gives no reason: {text}"
    for name, why in reasons.items():
        assert why in lines[name], f"{name}: expected {why!r} in {lines[name]!r}"
    assert lines["fallback"] == "APPLIES with default config {'threads': 256}"
    assert rules.find_rule(func, "h100").name == "fallback"
    sch = rules.apply_default(func, "h100")
    assert sch.rule == "fallback" and sch.config == {"threads": 256}
    check_schedule(func, sch, rng)


def test_explain_names_the_taking_rule_and_stops() -> None:
    f = wl.softmax(64, 1000)
    text = rules.explain(f, "h100")
    lines = declines(text)
    assert list(lines) == ["matmul", "gemv", "general_reduction"], text
    default = rules.get_rule("general_reduction").default_config(f, sl.hw.load("h100"))
    assert lines["general_reduction"] == f"APPLIES with default config {default}"
    small = declines(rules.explain(wl.matmul(4, 100, 64), "h100"))
    assert "extent 4 <= 8" in small["matmul"] and small["gemv"].startswith("APPLIES"), small


def test_explain_on_another_target_uses_its_profile() -> None:
    text = rules.explain(wl.matmul(64, 64, 64), "a100")
    assert text.splitlines()[0] == "func matmul on a100:"
    assert declines(text)["matmul"].startswith("APPLIES")


def test_apply_default_single_and_list() -> None:
    f1, f2, f3 = wl.matmul(64, 64, 32), wl.softmax(8, 100), wl.transpose(40, 24)
    one = rules.apply_default(f1, "h100")
    assert isinstance(one, sl.Schedule)
    assert one.rule == "matmul"
    assert one.config == rules.get_rule("matmul").default_config(f1, sl.hw.load("h100"))
    many = rules.apply_default([f1, f2, f3], "h100")
    assert isinstance(many, list) and len(many) == 3
    assert [s.rule for s in many] == ["matmul", "general_reduction", "transpose"]
    assert [s.func.name for s in many] == [f1.name, f2.name, f3.name]
    assert many[0].config == one.config
    assert rules.apply_default((f2,), "h100")[0].rule == "general_reduction"
    assert rules.apply_default([], "h100") == []
    # the input funcs are left untouched
    assert str(f1) == str(wl.matmul(64, 64, 32))


def test_default_target_is_h100() -> None:
    f = wl.matmul(256, 256, 64)
    assert rules.apply_default(f).config == rules.apply_default(f, "h100").config


def _boom(*args, **kwargs):
    raise RuntimeError("boom")


def test_rule_raising_in_apply_is_logged_and_skipped(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    f = wl.matmul(33, 40, 17)
    monkeypatch.setattr(rules.get_rule("matmul"), "apply", _boom)
    with caplog.at_level(logging.WARNING, logger="schedlib.rules"):
        sch = rules.apply_default(f, "h100")
    assert sch.rule == "fallback"  # the other special rules decline a matmul
    messages = [r.getMessage() for r in caplog.records if r.name == "schedlib.rules"]
    assert any("rule matmul raised on matmul: RuntimeError: boom" in m for m in messages), messages
    # a list keeps going too
    with caplog.at_level(logging.WARNING, logger="schedlib.rules"):
        out = rules.apply_default([f, wl.softmax(4, 64)], "h100")
    assert [s.rule for s in out] == ["fallback", "general_reduction"]


def test_rule_raising_in_analyze_is_logged_and_skipped(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    f = wl.gemv(100, 64, "float16")
    gemv = rules.get_rule("gemv")
    monkeypatch.setattr(gemv, "analyze", _boom)
    with caplog.at_level(logging.WARNING, logger="schedlib.rules"):
        sch = rules.apply_default(f, "h100")
        found = rules.find_rule(f, "h100")
    assert sch.rule == "fallback" and found.name == "fallback"
    messages = [r.getMessage() for r in caplog.records if r.name == "schedlib.rules"]
    assert any("rule gemv raised on gemv: RuntimeError: boom" in m for m in messages), messages
    assert any("rule gemv failed while matching gemv: boom" in m for m in messages), messages
    lines = declines(rules.explain(f, "h100"))
    assert lines["gemv"] == "declined: raised RuntimeError: boom"
    assert lines["fallback"].startswith("APPLIES")


def test_no_rule_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules.get_rule("fallback"), "analyze", lambda func, target: "disabled")
    f = stencil(8)
    with pytest.raises(LookupError, match="no rule applies to stencil"):
        rules.apply_default(f, "h100")
    with pytest.raises(LookupError, match="no rule applies to stencil"):
        rules.find_rule(f, "h100")
    text = rules.explain(f, "h100")
    assert text.splitlines()[-2:] == ["  fallback: declined: disabled", "  no rule applies"]


def test_apply_returns_none_when_the_rule_declines() -> None:
    assert rules.get_rule("matmul").apply(wl.softmax(8, 64), "h100") is None
    assert rules.get_rule("transpose").apply(wl.elementwise((8, 8), ("exp",)), "h100") is None
    assert rules.get_rule("gemv").apply(wl.matmul(64, 64, 64), "h100") is None


# config validation ----------------------------------------------------------------------------------------

VALIDATION = [
    ("matmul", lambda: wl.matmul(64, 64, 64), {"block_m": 24}, "block_m", "knob block_m=24 is not one of"),
    ("matmul", lambda: wl.matmul(64, 64, 64), {"thread_m": 16}, "thread_m", "knob thread_m=16 is not one of"),
    ("gemv", lambda: wl.gemv(256, 256), {"threads_k": 48}, "threads_k", "knob threads_k=48 is not one of"),
    ("gemv", lambda: wl.gemv(256, 256, trans=True), {"threads_n": 512}, "threads_n", "knob threads_n=512"),
    ("reduction", lambda: wl.reduce(64, 64), {"vector": 8}, "vector", "knob vector=8 is not one of"),
    ("general_reduction", lambda: wl.softmax(8, 64), {"unroll": 3}, "unroll", "knob unroll=3"),
    ("transpose", lambda: wl.transpose(64, 64), {"tile": 128}, "tile", "knob tile=128"),
    ("elementwise", lambda: wl.elementwise((64,), ("exp",)), {"threads": 32}, "threads", "knob threads=32"),
    ("fallback", lambda: wl.softmax(8, 64), {"threads": 2048}, "threads", "knob threads=2048"),
]


@pytest.mark.parametrize("rule_name, make, change, knob, message", VALIDATION,
                         ids=[f"{v[0]}-{v[3]}" for v in VALIDATION])
def test_validate_rejects_an_out_of_range_knob(rule_name, make, change, knob, message) -> None:
    func = make()
    rule = rules.get_rule(rule_name)
    profile = sl.hw.load("h100")
    space = rule.space(func, profile)
    config = {**rule.default_config(func, profile), **change}
    assert space.validate(rule.default_config(func, profile)) == rule.default_config(func, profile)
    with pytest.raises(sl.ScheduleError) as info:
        space.validate(config)
    err = info.value
    assert err.primitive == f"{rule_name}.apply" and err.argument == "config" and err.value == config
    assert message in str(err) and knob in err.reason, str(err)
    with pytest.raises(sl.ScheduleError, match=message):
        rule.apply(func, "h100", config)


@pytest.mark.parametrize("rule_name, make", [(v[0], v[1]) for v in VALIDATION[::2]],
                         ids=[v[0] for v in VALIDATION[::2]])
def test_validate_rejects_missing_and_unknown_knobs(rule_name, make) -> None:
    func = make()
    rule = rules.get_rule(rule_name)
    profile = sl.hw.load("h100")
    space = rule.space(func, profile)
    default = rule.default_config(func, profile)
    first = space.names[0]
    missing = {k: v for k, v in default.items() if k != first}
    with pytest.raises(sl.ScheduleError, match=f"knob {first} is missing"):
        space.validate(missing)
    with pytest.raises(sl.ScheduleError, match=r"unknown knob\(s\) \['warp_specialize'\]"):
        space.validate({**default, "warp_specialize": True})


MM = {"split_k": 1, "stages": 1, "tensor_core": False, "raster": 1}


@pytest.mark.parametrize("rule_name, make, config, why", [
    ("matmul", lambda: wl.matmul(64, 64, 64),
     {"block_m": 16, "block_n": 16, "block_k": 8, "thread_m": 8, "thread_n": 8, "vector": 1, **MM},
     r"4 threads per block \(needs 32..1024\)"),
    ("matmul", lambda: wl.matmul(64, 64, 64),
     {"block_m": 32, "block_n": 32, "block_k": 8, "thread_m": 1, "thread_n": 1, "vector": 1, **MM},
     "vector width does not divide the copy evenly"),
    ("gemv", lambda: wl.gemv(256, 256), {"rows_per_block": 8, "threads_k": 512, "vector": 1},
     "4096 threads exceed 1024"),
    ("gemv", lambda: wl.gemv(256, 256, trans=True), {"threads_n": 256, "vector": 1, "threads_k": 16, "unroll": 1},
     "4096 threads exceed 1024"),
    ("reduction", lambda: wl.reduce(64, 64), {"rows_per_block": 8, "threads_k": 1024, "vector": 1, "blocks_per_row": 1},
     "8192 threads exceed 1024"),
    ("reduction", lambda: wl.reduce(64, 64, axis=0), {"threads_n": 256, "vector": 1, "threads_k": 8, "unroll": 2},
     "2048 threads exceed 1024"),
    ("transpose", lambda: wl.transpose(64, 64), {"tile": 64, "rows_per_thread": 2, "pad": 1},
     "too many threads per block"),
], ids=["matmul-threads", "matmul-vector", "gemv-inner", "gemv-outer", "reduction-inner", "reduction-outer",
        "transpose"])
def test_validate_rejects_an_illegal_combination(rule_name, make, config, why) -> None:
    func = make()
    rule = rules.get_rule(rule_name)
    space = rule.space(func, sl.hw.load("h100"))
    assert all(config[k.name] in k.values for k in space.knobs), "each knob alone is in range"
    assert not space.is_legal(config)
    assert space.reason(config) is not None
    with pytest.raises(sl.ScheduleError, match=why):
        space.validate(config)
    with pytest.raises(sl.ScheduleError, match=why):
        rule.apply(func, "h100", config)


def test_space_is_sized_by_the_target() -> None:
    """Knob limits come from the profile: a smaller GPU (max 1024 threads on all, but less shared memory
    on some) must never get a point its profile forbids."""
    f = wl.matmul(512, 512, 512, dtype="float16")
    for target in ("h100", "a100", "t4", "rtx4090"):
        profile = sl.hw.load(target)
        space = rules.get_rule("matmul").space(f, profile)
        for config in space.enumerate():
            threads = (config["block_m"] // config["thread_m"]) * (config["block_n"] // config["thread_n"])
            assert threads <= profile.max_threads_per_block
            assert (config["block_m"] + config["block_n"]) * config["block_k"] * 2 <= profile.shared_memory_per_block
        assert space.is_legal(rules.get_rule("matmul").default_config(f, profile))


@pytest.mark.parametrize("rule", rules.RULES, ids=lambda r: r.name)
def test_rule_methods_take_a_profile_key_as_readily_as_a_profile(rule: rules.Rule) -> None:
    func = wl.softmax(8, 8)
    profile = sl.hw.load("a100")
    assert rule.applies(func, "a100") == rule.applies(func, profile)
    if rule.applies(func, profile) is None:
        assert rule.space(func, "a100") == rule.space(func, profile)
        assert rule.default_config(func, "a100") == rule.default_config(func, profile)


def test_explain_names_the_rule_apply_default_picks_when_a_matching_rule_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule that matches but raises while scheduling is skipped by the dispatcher; explain says so too."""
    from schedlib.rules.matmul import MatmulRule

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("template exploded")

    func = sl.workloads.matmul(64, 64, 64)
    monkeypatch.setattr(MatmulRule, "schedule", broken)
    picked = sl.rules.apply_default(func, "h100")
    text = sl.rules.explain(func, "h100")
    assert "matmul: declined: raised RuntimeError: template exploded" in text
    assert f"{picked.rule}: APPLIES" in text and picked.rule != "matmul"
    monkeypatch.setattr(MatmulRule, "default_config", broken)  # explain must not raise either
    assert "matmul: declined: raised RuntimeError" in sl.rules.explain(func, "h100")


def test_no_rule_applying_says_what_each_failing_rule_raised() -> None:
    """2^31 - 1 elements: every split rounds the loop up past the 32-bit index range."""
    func = sl.workloads.elementwise((2**31 - 1,), ("relu",), "int8")
    with pytest.raises(LookupError, match=r"no rule applies to elementwise_relu \(elementwise raised "
                                          r"ScheduleError: split: .*more than 2\^31-1.*; fallback raised"):
        sl.rules.apply_default(func, "h100")
    assert "elementwise: declined: raised ScheduleError" in sl.rules.explain(func, "h100")
