"""SASS loops and their instruction mix: the parser on a fixed listing, the tool lookup and its errors, and
``Kernel.loop_mix`` on a real cubin when nvdisasm is installed (the test extras install it)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

import schedlib as sl
from schedlib.errors import CompileError
from schedlib.runtime import sass
from schedlib.runtime.nvcc import find_nvcc

LISTING = (Path(__file__).parent / "data" / "two_loops.sass").read_text()


def test_parse_reads_kernels_instructions_and_labels() -> None:
    kernels = sass.parse(LISTING)
    assert list(kernels) == ["k_C", "other_D"]
    instructions, labels = kernels["k_C"]
    assert len(instructions) == 12 and labels == {".L_x_0": 2, ".L_x_1": 3, ".L_x_3": 9, ".L_x_2": 11}
    guarded = instructions[8]
    assert (guarded.offset, guarded.predicate, guarded.opcode, guarded.base) == (0x80, "@!P1", "BRA", "BRA")
    assert instructions[2].opcode == "LDS.128" and instructions[2].family == "shared"
    assert instructions[5].family == "other" and instructions[7].family == "sync"


def test_loops_are_closed_by_backward_branches_only() -> None:
    found = sass.loops(LISTING)
    # k_C: the outer loop holds the inner one; the forward branch and the branch-to-self trap are no loops
    spans = [(lp.kernel, lp.start, lp.end, lp.innermost) for lp in found]
    assert spans == [("k_C", 0x20, 0x80, False), ("k_C", 0x30, 0x60, True), ("other_D", 0x0, 0x20, True)]
    inner = found[1]
    assert inner.counts() == {"fp": 2, "other": 1, "control": 1}
    assert inner.opcodes().most_common(1) == [("FFMA", 2)]


def test_loop_mix_table() -> None:
    df = sass.loop_mix(LISTING)
    assert list(df["kernel"]) == ["k_C", "other_D"]  # innermost loops only by default
    k = df.iloc[0]
    assert (k["start"], k["end"], k["instructions"], k["fp"], k["control"], k["math_share"]) == (
        "0x0030", "0x0060", 4, 2, 1, 0.5)
    assert k["top"] == "FFMA 2, ISETP 1, BRA 1"
    d = df.iloc[1]
    assert (d["tensor"], d["shared"], d["math_share"]) == (1, 1, pytest.approx(1 / 3))
    assert len(sass.loop_mix(LISTING, innermost_only=False)) == 3
    assert sass.loop_mix("no kernels here").empty


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_disassemble_runs_the_tool_and_reports_its_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listing = tmp_path / "listing.sass"
    listing.write_text(LISTING)
    monkeypatch.setenv("SCHEDLIB_NVDISASM", _script(tmp_path / "ok", f'cat "{listing}"\n'))
    assert sass.disassemble(tmp_path / "any.cubin") == LISTING
    monkeypatch.setenv("SCHEDLIB_NVDISASM", _script(tmp_path / "bad", 'echo "not a cubin: $2" >&2; exit 1\n'))
    with pytest.raises(CompileError, match=r"nvdisasm failed on .*x\.cubin: not a cubin: .*x\.cubin"):
        sass.disassemble(tmp_path / "x.cubin")


def test_a_missing_tool_is_named_with_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "not_executable"
    plain.write_text("")
    monkeypatch.setenv("SCHEDLIB_NVDISASM", str(plain))
    assert sass.find_nvdisasm() is None
    with pytest.raises(CompileError, match="pip install nvidia-cuda-nvdisasm"):
        sass.disassemble(tmp_path / "x.cubin")


@pytest.mark.skipif(find_nvcc() is None or sass.find_nvdisasm() is None,
                    reason="needs nvcc and nvdisasm (pip install nvidia-cuda-nvdisasm, part of the test extras)")
def test_loop_mix_of_a_simt_matmul_is_mostly_ffma(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDLIB_NVDISASM", raising=False)
    # the 4096^3 default: 128 x 128 tiles, 8 x 8 results per thread, 16-deep k steps (1024 FFMA per step)
    kernel = sl.build(sl.rules.apply_default(sl.workloads.matmul(4096, 4096, 4096), "h100"), "h100")
    df = kernel.loop_mix()
    hot = df.loc[df["instructions"].idxmax()]
    assert hot["kernel"] == "matmul_C" and hot["top"].startswith("FFMA 1024")
    assert hot["math_share"] > 0.85 and hot["local"] == 0
