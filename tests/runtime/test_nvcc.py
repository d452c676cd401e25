"""The kernels the emulator runs also compile for real GPUs, and ptxas resource usage is parsed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from emu_kernels import ALL_KERNELS, MATMUL, VADD, full, mma_kernel

from schedlib.errors import CompileError
from schedlib.runtime.nvcc import CompileReport, compile_check, find_nvcc, nvrtc_available, parse_ptxas, ptx

needs_nvcc = pytest.mark.skipif(
    find_nvcc() is None, reason="nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, /usr/local/bin)"
)
needs_nvrtc = pytest.mark.skipif(
    not nvrtc_available(), reason="NVRTC not usable: needs cupy, the nvidia-cuda-nvrtc library and CUDA headers"
)

KERNEL_NAMES = {
    "vadd", "matmul", "rowsum", "h_convert", "h_arith", "bf_convert", "bf_arith", "dyn_reverse", "axpb4",
    "ldm_raw", "mma_raw", "atomic_sum", "indices", "warp_ops", "mma_rk_f16", "mma_tn_f16", "mma_rk_bf16", "mma_tn_bf16",
}
STATIC_SMEM = {"matmul": 2 * 16 * 16 * 4, "rowsum": 32 * 4, "ldm_raw": 256 * 2, "mma_rk_f16": (256 + 128) * 2}


def check_report(report: CompileReport, arch: str) -> None:
    assert report.arch == arch
    assert set(report.kernels) == KERNEL_NAMES, report.log
    for name, res in report.kernels.items():
        assert res.name == name
        assert res.registers > 0
        assert res.spill_store_bytes == res.spill_load_bytes == 0
    for name, smem in STATIC_SMEM.items():
        assert report.kernels[name].shared_static_bytes == smem, name
    assert report.kernels["vadd"].shared_static_bytes == 0
    assert report.registers == max(k.registers for k in report.kernels.values())
    assert report.shared_static_bytes == STATIC_SMEM["matmul"]
    assert report.spill_bytes == 0


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_emulated_kernels_compile_with_nvcc(arch: str) -> None:
    check_report(compile_check(full(*ALL_KERNELS), arch, compiler="nvcc"), arch)


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_emulated_kernels_compile_with_nvrtc(arch: str) -> None:
    report = compile_check(full(*ALL_KERNELS), arch, compiler="nvrtc")
    assert report.compiler == "nvrtc"
    check_report(report, arch)


@needs_nvcc
def test_prelude_compiles_for_an_arch_without_tensor_core_instructions() -> None:
    """Unused sm_80 wrappers must not break a plain kernel on sm_75; using them must fail clearly."""
    assert compile_check(full(VADD), "sm_75").kernels["vadd"].registers > 0
    with pytest.raises(CompileError, match=r"(?s)nvcc failed for sm_75.*(mma|sm_80)"):
        compile_check(full(mma_kernel("rk", "f16")), "sm_75")


@needs_nvcc
def test_compile_error_carries_the_log() -> None:
    bad = full(VADD.replace("a[i] + b[i]", "a[i] + not_declared"))
    with pytest.raises(CompileError, match=r"(?s)nvcc failed for sm_90.*not_declared") as err:
        compile_check(bad, "sm_90")
    assert "error" in str(err.value)


@needs_nvcc
def test_ptx_is_nvccs_text_and_its_errors_carry_the_log() -> None:
    text = ptx(full(VADD), "sm_90")
    assert ".visible .entry vadd(" in text and ".target sm_90" in text
    with pytest.raises(CompileError, match=r"(?s)nvcc failed for sm_90.*not_declared"):
        ptx(full(VADD.replace("a[i] + b[i]", "a[i] + not_declared")), "sm_90")


@needs_nvrtc
def test_nvrtc_compile_error_carries_the_log() -> None:
    with pytest.raises(CompileError, match=r"(?s)NVRTC failed for sm_90.*not_declared"):
        compile_check(full(VADD.replace("a[i] + b[i]", "a[i] + not_declared")), "sm_90", compiler="nvrtc")


def test_bad_arch_and_compiler_arguments_are_refused() -> None:
    with pytest.raises(CompileError, match=re.escape("arch 'compute_90' is not of the form sm_XY "
                                                     "(e.g. sm_80, sm_90, sm_90a)")):
        compile_check(full(VADD), "compute_90")
    with pytest.raises(CompileError, match=re.escape("compiler must be 'nvcc', 'nvrtc' or None, got 'clang'")):
        compile_check(full(VADD), "sm_90", compiler="clang")


@needs_nvcc
def test_reports_are_cached_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(tmp_path))
    source = full(MATMUL) + "\n// cache test\n"
    first = compile_check(source, "sm_90", extra_flags=["-lineinfo"])
    files = list((tmp_path / "compile").glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["kernels"]["matmul"]["registers"] == first.kernels["matmul"].registers
    monkeypatch.setattr("schedlib.runtime.nvcc._run_nvcc", lambda *a: pytest.fail("cache miss"))
    assert compile_check(source, "sm_90", extra_flags=["-lineinfo"]) == first


def test_no_compiler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("schedlib.runtime.nvcc.find_nvcc", lambda: None)
    monkeypatch.setattr("schedlib.runtime.nvcc.nvrtc_available", lambda: False)
    with pytest.raises(CompileError, match=r"nvcc was not found.*NVRTC is not usable"):
        compile_check(full(VADD), "sm_90")


def test_parse_ptxas_reads_nvcc_and_nvrtc_formats() -> None:
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k1' for 'sm_80'
ptxas info    : Function properties for k1
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 368 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compiling entry function 'k2' for 'sm_80'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers
"""
    k = parse_ptxas(log)
    assert k["k1"].registers == 40 and k["k1"].shared_static_bytes == 2048 and k["k1"].constant_bytes == 376
    assert (k["k1"].stack_frame_bytes, k["k1"].spill_store_bytes, k["k1"].spill_load_bytes) == (16, 8, 4)
    assert k["k2"].registers == 12 and k["k2"].shared_static_bytes == 0 and k["k2"].stack_frame_bytes == 0
