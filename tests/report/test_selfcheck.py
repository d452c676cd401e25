"""``sl.report.tensor_core_selfcheck`` on the emulator: the rows a device run would give, for a subset of cases."""

from __future__ import annotations

import pytest

import schedlib as sl
from schedlib.report import tensor_core_selfcheck
from schedlib.runtime.emulator import find_gxx

needs_gxx = pytest.mark.skipif(find_gxx() is None, reason="the CUDA emulator needs g++")


@needs_gxx
def test_every_template_passes_on_the_emulator() -> None:
    # one layout per template here: the rule tests run every layout of each template
    df = tensor_core_selfcheck("h100", backend="emulator", cases=("tn_f16",))
    assert list(zip(df["template"], df["case"])) == [("wgmma_tma", "tn_f16"), ("wgmma", "tn_f16"),
                                                     ("wgmma_ws", "tn_f16"), ("True", "tn_f16")]
    assert df["ok"].all() and (df["max_err"] < 1e-2).all() and (df["error"] == "").all(), df.to_string()
    assert [c["tensor_core"] for c in df["config"]] == ["wgmma_tma", "wgmma", "wgmma_ws", True]


def test_a_template_the_target_lacks_is_a_row_not_an_error() -> None:
    df = tensor_core_selfcheck(sl.hw.load("a100"), backend="emulator", templates=("wgmma",), cases=("nn_bf16",))
    (row,) = df.itertuples()
    assert not row.ok and row.error.startswith("not available: tensor_core='wgmma' is not in this matmul's space")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="backend must be 'gpu' or 'emulator'"):
        tensor_core_selfcheck("h100", backend="cpu")
    with pytest.raises(ValueError, match=r"unknown case\(s\) \['xx'\]"):
        tensor_core_selfcheck("h100", backend="emulator", cases=("xx",))
