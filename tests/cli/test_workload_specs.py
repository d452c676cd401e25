"""Workload spec strings and suite files: typed parameters, round trips and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlib.errors import IRError
from schedlib.ir.expr import Var
from schedlib.suites import load_suite_file, parse_workload


@pytest.mark.parametrize(("text", "value"), [("no", False), ("off", False), ("0", False), ("False", False),
                                             ("yes", True), ("on", True), ("1", True), ("true", True)])
def test_boolean_parameters_read_their_text(text: str, value: bool) -> None:
    spec = parse_workload(f"matmul:M=64,N=32,K=16,trans_a={text}")
    assert spec.params["trans_a"] is value
    a_shape = tuple(int(d.value) for d in spec.build().buffer("A").shape)
    assert a_shape == ((16, 64) if value else (64, 16))


@pytest.mark.parametrize(("text", "needle"), [
    ("matmul:trans_a=maybe", "trans_a='maybe' must be true or false"),
    ("matmul:M=64,M=128", "M is given twice"),
    ("matmul:M=64,,N=64", "has an empty item between commas"),
    ("softmax:rows=8,cols=8,axis=2", "axis=2; expected -1/1 (last) or 0 (first)"),
    ("matmul:M=99999999999", "below 2^31"),
    ("matmul:M=1.5", "M='1.5' must be a positive int"),
    ("reduce:axis=x", "axis='x' must be an int"),
    ("rmsnorm:eps=abc", "eps='abc' must be a number"),
    ("elementwise:shape=4xq", "shape='q' must be a positive int"),
])
def test_bad_parameter_values_are_refused_by_name(text: str, needle: str) -> None:
    with pytest.raises(IRError) as info:
        parse_workload(text)
    assert needle in str(info.value)


def test_symbolic_dimensions_inside_a_shape_round_trip() -> None:
    spec = parse_workload("elementwise:shape=$Mx4,chain=add+relu")
    assert isinstance(spec.params["shape"][0], Var) and spec.params["shape"][1] == 4
    assert spec.text == "elementwise:shape=$Mx4,chain=add+relu"
    assert parse_workload(spec.text).params == spec.params
    assert spec.scaled(2).params["shape"][1] == 2  # the symbolic dimension stays symbolic


def test_none_reads_as_none_for_optional_parameters() -> None:
    spec = parse_workload("matmul:M=8,N=8,K=8,batch=none,epilogue=null")
    assert spec.params["batch"] is None and spec.params["epilogue"] is None


def test_suite_file_values_are_typed_like_spec_strings(tmp_path: Path) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text("- {kind: matmul, M: 64, N: 32, K: 16, trans_a: 'no'}\n"
                    "- {kind: elementwise, shape: 5, chain: add+relu}\n"
                    "- {kind: gemv, N: 64, K: '$K'}\n")
    mm, ew, gv = load_suite_file(path)
    assert mm.params["trans_a"] is False
    assert ew.params["shape"] == (5,) and ew.params["chain"] == ("add", "relu")
    assert isinstance(gv.params["K"], Var)


@pytest.mark.parametrize(("entry", "needle"), [
    ("{kind: [matmul]}", "unknown workload ['matmul']"),
    ("{kind: elementwise, shape: {a: 1}}", "shape={'a': 1} must be sizes"),
    ("{kind: matmul, M: true}", "M=True must be a positive int"),
    ("{kind: matmul, dtype: 16}", "dtype=16 must be a name"),
])
def test_bad_suite_entries_name_the_file_and_entry(tmp_path: Path, entry: str, needle: str) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(f"- matmul:M=8,N=8,K=8\n- {entry}\n")
    with pytest.raises(IRError) as info:
        load_suite_file(path)
    assert str(path) in str(info.value) and "entry 1" in str(info.value)
    assert needle in str(info.value)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("bad.yaml", "workloads:\n  - matmul\n  - [gemv\n", "line 4, column 1: not valid YAML (expected ',' or ']', "
                                                        "but got '<stream end>')"),
    ("bad.json", '{"workloads": ["matmul",]}', "line 1, column 25: not valid JSON (Expecting value): "
                                              "'{\"workloads\": [\"matmul\",]}'"),
])
def test_a_suite_file_syntax_error_names_line_and_column(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(IRError) as info:
        load_suite_file(path)
    assert str(info.value) == f"suite file {path}: {message}"
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("text", "shapes"), [
    ("matmul:dtype=float16", {"A": (64, 64), "B": (64, 64)}),  # M, N, K all left at 1024
    ("softmax", {"X": (64, 64)}),  # rows and cols left at 4096
    ("gemv:N=8", {"X": (1, 64), "W": (8, 64)}),  # K left at 4096; N explicit and already small; batch 1
    ("elementwise:chain=exp", {"X": (64, 64)}),  # the default shape (4096, 4096)
    ("matmul:M=8,batch=100", {"A": (64, 8, 64), "B": (64, 64, 64)}),
])
def test_scaled_caps_sizes_left_at_the_builders_defaults(text: str, shapes: dict[str, tuple[int, ...]]) -> None:
    func = parse_workload(text).scaled(64).build()
    assert {n: tuple(d.value for d in func.buffer(n).shape) for n in func.inputs} == shapes


def test_scaled_spells_the_capped_defaults_and_keeps_the_rest() -> None:
    spec = parse_workload("matmul:dtype=float16").scaled(64)
    assert spec.params == {"M": 64, "N": 64, "K": 64, "dtype": "float16"}  # batch=None stays "no batch axis"
    assert parse_workload(spec.text).params == spec.params
    assert parse_workload("gemv:N=$NN").scaled(64).params["N"] == Var("NN")  # symbolic sizes stay symbolic
