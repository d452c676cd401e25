"""``sl.report.compare`` on the estimate backend: template rows, and a failing method that loses only its own row."""

from __future__ import annotations

import importlib
import math
import re
from pathlib import Path

import pytest

import schedlib as sl
from schedlib.report import compare
from schedlib.report.timer import MethodTimer

cmp = importlib.import_module("schedlib.report.compare")  # the package re-exports the function under this name


def test_template_rows_put_mma_sync_next_to_the_wgmma_default() -> None:
    f = sl.workloads.matmul(4096, 4096, 4096, "float16")
    df = compare([f], "h100", methods=("rule", "vendor"), templates=("wgmma", True, "nosuch"), backend="estimate")
    assert list(df["method"]) == ["rule", "rule[tensor_core=wgmma]", "rule[tensor_core=True]", "vendor"]
    rule, cp_async, mma = df.iloc[0], df.iloc[1], df.iloc[2]  # a template it lacks ("nosuch"): no row
    assert rule["config"]["tensor_core"] == "wgmma_tma" and cp_async["config"]["tensor_core"] == "wgmma"
    assert mma["config"]["tensor_core"] is True
    assert mma["time_us"] > rule["time_us"] > 0  # the model prices mma.sync on Hopper below wgmma
    fp32 = compare([sl.workloads.matmul(512, 512, 512)], "h100", methods=("rule",), templates=(True,),
                   backend="estimate")
    assert list(fp32["method"]) == ["rule"]  # fp32 has no tensor-core template


def test_a_failing_method_keeps_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> list:
        raise RuntimeError("matmul: kernel result differs from the vendor result by 3.5")

    monkeypatch.setitem(cmp._METHODS, "rule", broken)
    df = compare([sl.workloads.matmul(1024, 1024, 1024, "float16")], "h100", methods=("rule", "carver", "vendor"),
                 backend="estimate")
    assert list(df["method"]) == ["rule", "carver", "carver_best_of_k", "vendor"]
    failed = df.iloc[0]
    assert math.isnan(failed["time_us"]) and not failed["measured"]
    assert failed["source"] == "failed: RuntimeError: matmul: kernel result differs from the vendor result by 3.5"
    assert (df.iloc[1:3]["time_us"] > 0).all() and (df.iloc[1:3]["source"] == "estimated").all()


def test_a_failing_carver_config_is_skipped_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """With measurements, each of the top-k is timed; one that fails is left out of the best-of-k and counted."""
    calls = []

    def timed(timer: object, sch: object, rule: object, config: dict) -> dict:
        calls.append(config)
        if len(calls) == 1:
            raise RuntimeError("illegal memory access")
        return {"time_us": 10.0 + len(calls), "p20_us": 10.0, "p80_us": 12.0}

    monkeypatch.setattr(cmp, "_timed", timed)
    timer = MethodTimer(sl.hw.load("h100"), measured=False)
    timer.measured = True  # time every one of the top-k (timing itself is the stub above)
    rows = dict(cmp._carver_rows(sl.workloads.matmul(1024, 1024, 1024, "float16"), sl.hw.load("h100"), timer, 3))
    assert rows["carver"]["source"] == "failed: RuntimeError: illegal memory access"
    best = rows["carver_best_of_k"]
    assert best["time_us"] == 12.0 and best["config"] == calls[1] and best["source"].startswith("1 of 3 failed")


@pytest.mark.parametrize(("kwargs", "error", "needle"), [
    ({"backend": "foo"}, ValueError, "backend='foo'"),
    ({"trials": 0}, ValueError, "trials=0"),
    ({"topk": -1}, ValueError, "topk=-1"),
    ({"strategy": "annealing"}, ValueError, "unknown strategy 'annealing'"),
    ({"methods": ("rule", "magic")}, ValueError, "'magic'"),
])
def test_bad_arguments_raise_before_any_row_is_made(kwargs: dict, error: type, needle: str) -> None:
    with pytest.raises(error) as info:
        compare(["transpose:M=8,N=8"], "h100", **kwargs)
    assert needle in str(info.value)


def test_a_lone_spec_string_and_method_name_are_one_item_each() -> None:
    df = compare("transpose:M=8,N=8", "h100", methods="rule", backend="estimate")
    assert list(df["method"]) == ["rule"] and list(df["workload"]) == ["transpose:M=8,N=8"]


def test_workloads_of_another_type_are_refused() -> None:
    with pytest.raises(TypeError, match="got 5"):
        compare([5], "h100", backend="estimate")


def test_variants_add_one_knob_ablations_of_the_rule_default() -> None:
    df = compare([sl.workloads.matmul(512, 512, 512), sl.workloads.softmax(64, 32000)], "h100", methods=("rule",),
                 backend="estimate", variants=[{"stages": 1}, {"stage_row": False}, {"stages": 3}])
    rows = {(r.workload, r.method): r for r in df.itertuples()}
    assert set(rows) == {("matmul", "rule"), ("matmul", "rule[stages=1]"), ("matmul", "rule[stages=3]"),
                         ("softmax", "rule"), ("softmax", "rule[stage_row=False]")}  # 128 KB rows: staged
    single = rows[("matmul", "rule[stages=1]")]
    assert single.config == {**rows[("matmul", "rule")].config, "stages": 1} and single.time_us > 0
    assert rows[("matmul", "rule[stages=3]")].source == "not in the space: knob stages=3 is not one of [1, 2]"
    assert rows[("softmax", "rule[stage_row=False]")].config["stage_row"] is False
    with pytest.raises(ValueError, match="variants must be a list of non-empty"):
        compare([sl.workloads.matmul(64, 64, 64)], "h100", methods=("rule",), backend="estimate",
                variants={"stages": 1})
    # a knob no workload's rule has (misspelt) is refused, not silently left without a row
    with pytest.raises(ValueError, match=re.escape("compare: variant {'stagse': 1}: no workload's rule has "
                                                   "knob(s) ['stagse']; their knobs are [")):
        compare([sl.workloads.matmul(64, 64, 64)], "h100", methods=("rule",), backend="estimate",
                variants=[{"stages": 1}, {"stagse": 1}])
    with pytest.raises(ValueError, match=re.escape("compare: variant {'stages': 1, 'stage_row': True}: no workload's "
                                                   "rule has all of its knobs")):
        compare([sl.workloads.matmul(64, 64, 64), sl.workloads.softmax(8, 64)], "h100", methods=("rule",),
                backend="estimate", variants=[{"stages": 1, "stage_row": True}])


def test_a_symbolic_workload_is_compared_at_the_carvers_size() -> None:
    """Its kernel stays symbolic; work, roofline and times are those at M=4096, as carve and tune rank it."""
    M = sl.var("M")
    df = compare(["softmax:rows=$M,cols=1024", sl.workloads.softmax(M, 1024)], "h100", methods=("rule", "carver"),
                 backend="estimate")
    assert set(df["shape"]) == {"X[Mx1024] at M=4096"}
    concrete = compare(["softmax:rows=4096,cols=1024"], "h100", methods=("rule",), backend="estimate")
    rule = df[df["method"] == "rule"].iloc[0]
    assert rule["gbs"] / rule["pct_roofline"] == pytest.approx(concrete["gbs"][0] / concrete["pct_roofline"][0])
    assert (df["time_us"] > 0).all() and df["tflops"].map(math.isfinite).all()


def test_progress_is_called_once_per_workload() -> None:
    lines: list[str] = []
    compare(["transpose:M=8,N=8", "reduce:rows=8,cols=8"], "h100", methods="rule", backend="estimate",
            progress=lines.append)
    assert len(lines) == 2 and lines[0].startswith("compare: workload 1/2: transpose:M=8,N=8 (rule; ")
    assert lines[1].startswith("compare: workload 2/2: reduce:rows=8,cols=8 (rule; ")


def test_a_method_named_twice_runs_and_shows_once() -> None:
    lines: list[str] = []
    df = compare(["transpose:M=8,N=8"], "h100", methods=["rule", "carver", "rule"], backend="estimate", topk=1,
                 progress=lines.append)
    assert lines[0].startswith("compare: workload 1/1: transpose:M=8,N=8 (rule, carver; "), lines
    assert list(df["method"]).count("rule") == 1


def test_vendor_alone_is_refused_on_the_estimate_backend() -> None:
    with pytest.raises(ValueError, match=r"methods=\('vendor',\) has no time without a GPU"):
        compare(["transpose:M=8,N=8"], "h100", methods="vendor", backend="estimate")


@pytest.mark.skipif(sl.runtime.gpu.gpu_available(), reason="'auto' means the GPU present when there is one")
def test_auto_in_any_case_estimates_for_the_h100() -> None:
    df = compare(["transpose:M=8,N=8"], "AUTO", methods="rule", backend="estimate")
    assert df.attrs["target"] == "h100"


def test_the_search_row_counts_this_comparisons_trials(tmp_path: Path) -> None:
    """By default each comparison searches in a study of its own: the row's trials are the ones it ran,
    not those of an earlier run of the same workload; a study given as storage is resumed and said so."""
    spec = "matmul:M=256,N=256,K=256"
    first = compare(spec, "h100", methods=("search",), trials=8, backend="estimate")
    second = compare(spec, "h100", methods=("search",), trials=4, backend="estimate")
    assert first["trials"].tolist() == [8] and second["trials"].tolist() == [4]
    assert second["source"].tolist() == ["estimated"]
    db = tmp_path / "study.sqlite3"
    compare(spec, "h100", methods=("search",), trials=6, backend="estimate", storage=str(db))
    resumed = compare(spec, "h100", methods=("search",), trials=9, backend="estimate", storage=str(db))
    assert resumed["trials"].tolist() == [9]
    assert resumed["source"].iloc[0] == ("estimated; best of the study's 9 trials, 3 of them run by this call "
                                         "(tuning_s counts those)")


def test_workloads_with_one_label_keep_rows_and_curves_apart(tmp_path: Path) -> None:
    funcs = [sl.workloads.matmul(128, 128, 128), sl.workloads.matmul(256, 256, 256)]  # both named "matmul"
    df = compare(funcs, "h100", methods=("rule", "search"), trials=4, backend="estimate")
    assert df["workload"].tolist() == ["matmul", "matmul", "matmul #2", "matmul #2"]
    assert sorted(df.attrs["histories"]) == ["matmul", "matmul #2"]
    html = sl.report.write_report(df, tmp_path)["html"].read_text()  # the curves come from df.attrs
    assert "Search convergence" in html and html.count("alt='matmul") == 2
