"""What a report must survive: a 16-bit workload on a profile without that dtype's tensor-core peak, a workload
none of whose configs is legal on the target, non-finite outputs in the kernel check, and report files that
cannot be written (found before the work, not after it)."""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import schedlib as sl
from schedlib.report import compare, write_report
from schedlib.report.compare import _failed
from schedlib.report.demo import check_output
from schedlib.report.writers import REPORT_FILES, prepare_out_dir

ROOT = Path(__file__).resolve().parents[2]


def starved_h100(tmp_path: Path) -> Path:
    """The h100 profile with too few registers for any matmul config (8192 per SM, 32 per thread)."""
    text = (ROOT / "hwprofiles" / "h100.yaml").read_text()
    assert "registers_per_sm: 65536" in text and "max_registers_per_thread: 255" in text
    text = text.replace("registers_per_sm: 65536", "registers_per_sm: 8192")
    path = tmp_path / "h100.yaml"
    path.write_text(text.replace("max_registers_per_thread: 255", "max_registers_per_thread: 32"))
    return path


# 16-bit workloads on a profile without that dtype's tensor-core peak


@pytest.mark.parametrize(("target", "spec"), [("t4", "softmax:rows=64,cols=1024,dtype=bfloat16"),
                                              ("v100", "matmul:M=64,N=64,K=64,dtype=bfloat16")])
def test_a_16_bit_workload_without_a_tensor_peak_gets_the_simt_roofline(target: str, spec: str) -> None:
    df = compare([spec], target, methods=("rule",), backend="estimate")
    row = df.iloc[0]
    assert math.isfinite(row["pct_roofline"]) and row["pct_roofline"] > 0, row
    assert df.attrs["roofline"] == (f"profile {target}; bfloat16 against the fp32 SIMT peak ({target} records no "
                                    "bfloat16 tensor-core peak)")


def test_a_16_bit_workload_with_a_tensor_peak_keeps_it() -> None:
    df = compare(["matmul:M=64,N=64,K=64,dtype=float16"], "t4", methods=("rule",), backend="estimate")
    assert df.attrs["roofline"] == "profile t4"  # no note: T4 has fp16 tensor cores


def test_the_roofline_note_reaches_both_report_pages(tmp_path: Path) -> None:
    df = compare(["softmax:rows=64,cols=1024,dtype=bfloat16"], "t4", methods=("rule",), backend="estimate")
    paths = write_report(df, tmp_path)
    for page in ("markdown", "html"):
        assert "bfloat16 against the fp32 SIMT peak (t4 records no bfloat16 tensor-core peak)" in \
            paths[page].read_text()


# a workload with no legal config on the target


def test_compare_rows_say_that_no_config_is_legal(tmp_path: Path) -> None:
    df = compare(["matmul:M=512,N=512,K=512"], str(starved_h100(tmp_path)), methods=("carver", "search"),
                 trials=2, backend="estimate")
    rows = {r["method"]: r for _, r in df.iterrows()}
    assert set(rows) == {"carver", "search"}
    reason = ("failed: no config of rule matmul for matmul is legal on h100: its knob space has no point within "
              "the target's limits (registers, shared memory, threads per block)")
    assert rows["carver"]["source"] == reason  # not "IndexError: single positional indexer is out-of-bounds"
    assert rows["search"]["source"].startswith(reason)
    assert all(math.isnan(r["time_us"]) for r in rows.values())


def test_a_failure_without_a_message_still_says_what_it_was() -> None:
    assert _failed(StopIteration())["source"] == "failed: StopIteration (raised without a message)"
    assert _failed(RuntimeError("x"), "the cause")["source"] == "failed: the cause; RuntimeError: x"
    assert _failed(RuntimeError("the cause"), "the cause")["source"] == "failed: the cause"


# non-finite outputs in the kernel check


def _check(got: list[float], ref: list[float]) -> tuple[float, float, bool]:
    func = sl.workloads.layernorm(1, 4)  # float32: tolerance 1e-4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inf - inf must not warn (nor give a NaN error)
        return check_output(func, np.array(got), np.array(ref))


def test_non_finite_values_in_the_same_places_match() -> None:
    inf, nan = math.inf, math.nan
    assert _check([nan, inf, -inf, 1.0], [nan, inf, -inf, 1.0]) == (0.0, 1e-4, True)
    assert _check([nan, nan], [nan, nan]) == (0.0, 1e-4, True)
    err, _, ok = _check([inf, 2.0 + 1e-3], [inf, 2.0])
    assert not ok and err == pytest.approx(5e-4)  # the finite values still within the tolerance, relatively


@pytest.mark.parametrize(("got", "ref"), [([math.nan, 1.0], [0.0, 1.0]), ([1.0, 1.0], [math.inf, 1.0]),
                                          ([math.inf, 1.0], [-math.inf, 1.0]), ([math.nan, 1.0], [math.inf, 1.0])])
def test_non_finite_values_that_differ_are_a_mismatch(got: list[float], ref: list[float]) -> None:
    assert _check(got, ref) == (math.inf, 1e-4, False)


# report files that cannot be written


def test_a_folder_in_place_of_a_report_file_is_refused_before_any_file_is_written(tmp_path: Path) -> None:
    (tmp_path / "report.html").mkdir()
    (tmp_path / "report.csv").write_text("earlier")
    with pytest.raises(sl.SchedlibError, match=r"cannot write the report to .*report\.html: it is a folder; move it"):
        prepare_out_dir(tmp_path, REPORT_FILES)
    df = compare(["softmax:rows=64,cols=64"], "h100", methods=("rule",), backend="estimate")
    with pytest.raises(sl.SchedlibError, match="it is a folder"):
        write_report(df, tmp_path)
    assert (tmp_path / "report.csv").read_text() == "earlier"  # not overwritten before the failure
    assert not (tmp_path / "report.md").exists()
    assert prepare_out_dir(tmp_path) == tmp_path  # files not asked about are not checked (benchmark scripts)


def test_a_dangling_symlink_is_named_as_one(tmp_path: Path) -> None:
    link = tmp_path / "out"
    os.symlink(tmp_path / "missing", link)
    with pytest.raises(sl.SchedlibError) as info:
        prepare_out_dir(link)
    assert str(info.value) == (f"cannot write the report to {link}: it is a symbolic link to {tmp_path / 'missing'}, "
                               "which does not exist; create that folder or choose another")
