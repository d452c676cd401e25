"""The per-user cache: where it may live, and how its entries recover from being damaged."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from schedlib.cache import cache_dir, cache_root
from schedlib.errors import EmulatorError, SchedlibError
from schedlib.runtime import nvcc
from schedlib.runtime.emulator import build

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")
STUB = "int sl_emu_abi_version(void) { return %d; }\nint sl_emu_launch__vadd(void) { return 0; }\n"


# where the cache may live ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sub,reason",
    [
        ("afile", "cannot be used: it exists and is not a directory"),
        ("afile/sub", "cannot be created: Not a directory"),
    ],
)
def test_unusable_cache_dir_names_directory_variable_and_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sub: str, reason: str
) -> None:
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(tmp_path / sub))
    with pytest.raises(SchedlibError, match=rf"{tmp_path / sub} \(from \$SCHEDLIB_CACHE_DIR\) {reason}"):
        cache_dir("emulator")


def test_xdg_cache_dir_is_named_as_the_origin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "afile").write_text("")
    monkeypatch.delenv("SCHEDLIB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "afile"))
    with pytest.raises(SchedlibError, match=r"afile/schedlib \(from \$XDG_CACHE_HOME\) cannot be created"):
        cache_root()


def test_cache_dirs_are_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(tmp_path / "new" / "cache"))
    path = cache_dir("emulator")
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o077 == 0


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")
def test_shared_or_foreign_cache_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    root.chmod(0o755)  # readable by others is fine: only writing in it could plant a library
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(root))
    assert cache_root() == root
    root.chmod(0o775)
    with pytest.raises(SchedlibError, match=r"writable by group or others \(mode 0o775\).*chmod go-w"):
        cache_root()
    root.chmod(0o700)
    (root / "tuning").mkdir(mode=0o700)
    (root / "tuning").chmod(0o777)
    with pytest.raises(SchedlibError, match=r"tuning \(from \$SCHEDLIB_CACHE_DIR\) is writable by group"):
        cache_dir("tuning")
    monkeypatch.setattr(os, "getuid", lambda: root.stat().st_uid + 1)
    with pytest.raises(SchedlibError, match=r"\(from \$SCHEDLIB_CACHE_DIR\) is owned by uid"):
        cache_root()


# compile reports ----------------------------------------------------------------------------------------------
def fake_compiler(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    monkeypatch.setattr(nvcc, "_compiler", lambda arch, compiler: ("nvcc", "nvcc", "fake nvcc"))

    def run(_nvcc: str, source: str, arch: str, flags: list[str]) -> tuple[str, bytes]:
        calls.append(source)
        return "ptxas info    : Compiling entry function 'k' for 'sm_90'\nptxas info    : Used 7 registers", b""

    monkeypatch.setattr(nvcc, "_run_nvcc", run)


@pytest.mark.parametrize(
    "content",
    [
        {"kernels": "x", "arch": "sm_90", "log": "", "compiler": "nvcc"},
        {"kernels": {"k": {"name": "k", "registers": "7"}}, "arch": "sm_90", "log": "", "compiler": "nvcc"},
        {"kernels": {"k": [1, 2]}, "arch": "sm_90", "log": "", "compiler": "nvcc"},
        {"kernels": {}, "arch": 90, "log": "", "compiler": "nvcc"},
        [1, 2, 3],
        "not json {",
    ],
    ids=["kernels_str", "bad_resources", "kernel_list", "arch_int", "top_list", "not_json"],
)
def test_malformed_cached_report_is_discarded_and_recomputed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: object
) -> None:
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(tmp_path))
    calls: list[str] = []
    fake_compiler(monkeypatch, calls)
    first = nvcc.compile_check("src", "sm_90")
    (report_file,) = (tmp_path / "compile").glob("*.json")
    report_file.write_text(content if isinstance(content, str) else json.dumps(content))
    assert nvcc.compile_check("src", "sm_90") == first and len(calls) == 2
    assert json.loads(report_file.read_text())["kernels"]["k"]["registers"] == 7  # rewritten
    assert nvcc.compile_check("src", "sm_90") == first and len(calls) == 2  # and used again


def test_cache_writes_leave_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        nvcc._write_atomic(tmp_path / "r.json", b"{}")
    assert list(tmp_path.iterdir()) == []


# emulator libraries ---------------------------------------------------------------------------------------
@pytest.fixture
def stub_gxx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for g++ that builds a tiny library from ``stub.c`` in a second or less, logging each build."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "stub.c").write_text(STUB % build.ABI_VERSION)
    script = bin_dir / "g++"
    script.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo stub; exit 0; }}\n'
        'case " $* " in *" c++-header "*) exit 1;; esac\n'  # cannot precompile headers: builds parse them
        f"echo build >> {bin_dir}/log\n"
        f"exec gcc -shared -fPIC -x c {bin_dir}/stub.c -o lib.so\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("SCHEDLIB_GXX", str(script))
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_loaded", {})
    build._gxx_version.cache_clear()
    return bin_dir


def builds(bin_dir: Path) -> int:
    log = bin_dir / "log"
    return len(log.read_text().splitlines()) if log.exists() else 0


SOURCE = '#include "sl_cuda_emu.h"\nextern "C" __global__ void vadd(int n) {}\n'


@needs_gcc
@pytest.mark.parametrize("damage", ["empty", "truncated", "no_symbol"])
def test_damaged_cached_library_is_rebuilt_once(stub_gxx: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    target = build.build_library(SOURCE, ["vadd"], bounds_check=False)
    assert builds(stub_gxx) == 1
    if damage == "no_symbol":
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-x", "c", "-", "-o", str(target)],
            input=b"int unrelated(void) { return 1; }\n",
            check=True,
        )
    else:
        target.write_bytes(target.read_bytes()[:100] if damage == "truncated" else b"")
    monkeypatch.setattr(build, "_loaded", {})  # as in a new process
    assert build.build_library(SOURCE, ["vadd"], bounds_check=False) == target
    assert builds(stub_gxx) == 2
    assert build.load_library(target).sl_emu_abi_version() == build.ABI_VERSION
    assert build.build_library(SOURCE, ["vadd"], bounds_check=False) == target and builds(stub_gxx) == 2


@needs_gcc
def test_library_without_abi_symbol_is_an_emulator_error_naming_it(stub_gxx: Path) -> None:
    (stub_gxx / "stub.c").write_text("int unrelated(void) { return 1; }\n")
    target = build.build_library(SOURCE, ["vadd"], bounds_check=False)
    with pytest.raises(EmulatorError, match=rf"{target} does not export sl_emu_abi_version"):
        build.load_library(target)
    (stub_gxx / "stub.c").write_text(STUB % (build.ABI_VERSION + 1))
    with pytest.raises(EmulatorError, match=rf"{target} speaks emulator ABI {build.ABI_VERSION + 1}"):
        build.load_library(build.build_library(SOURCE, ["vadd"], bounds_check=False))
    assert builds(stub_gxx) == 2  # rebuilt once, then the real failure is reported
