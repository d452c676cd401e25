"""Damaged cache entries heal instead of crashing or failing every later run: an emulator library cut short
(dlopen would die of SIGBUS), a damaged or missing precompiled header or an edited header copy, a damaged
cubin, and working directories a killed process left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from emu_kernels import VADD, full, needs_gxx, poisoned

from schedlib.runtime.elf import elf_problem
from schedlib.runtime.emulator import KernelLaunch, build, emulate
from schedlib.runtime.emulator import pch as pch_mod
from schedlib.runtime.emulator.workdirs import OWNER_FILE, STALE_AFTER_S, make_work_dir
from schedlib.runtime.nvcc import build_cubin, find_nvcc

TESTS = Path(__file__).resolve().parent
RUN_VADD = """
import numpy as np
from emu_kernels import VADD, full
from schedlib.runtime.emulator import KernelLaunch, emulate
a, b, c = np.arange(64, dtype=np.float32), np.ones(64, np.float32), np.zeros(64, np.float32)
emulate(full(VADD), [KernelLaunch("vadd", (1, 1, 1), (64, 1, 1), ("a", "b", "c", "n"))],
        {"a": a, "b": b, "c": c, "n": 64})
assert (c == a + 1).all()
print("ok")
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SCHEDLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_loaded", {})  # libraries of this test's cache only
    return tmp_path / "cache"


def _vadd(variant: int) -> None:
    """Build (or find) and run a variant of vadd: each variant is a separate library."""
    a, c = np.arange(16, dtype=np.float32), poisoned(16)
    launch = KernelLaunch("vadd", (1, 1, 1), (32, 1, 1), ("a", "b", "c", "n"))
    emulate(full(VADD) + f"\n// variant {variant}\n", [launch], {"a": a, "b": np.ones(16, np.float32), "c": c, "n": 16})
    np.testing.assert_array_equal(c, a + 1)


# 2: a library cut short ---------------------------------------------------------------------------------
@needs_gxx
def test_a_library_cut_short_is_rebuilt_not_a_crash(cache: Path) -> None:
    """dlopen of a .so cut after its headers touches pages past EOF: SIGBUS, in every later run, before."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", RUN_VADD], env=env, capture_output=True, text=True, timeout=600)

    assert run().stdout.strip() == "ok"
    (lib,) = (cache / "emulator").glob("*.so")
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) * 6 // 10])
    assert elf_problem(lib) is not None
    proc = run()
    assert proc.returncode == 0, f"exit {proc.returncode} (negative: killed by a signal)\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip() == "ok"
    assert lib.stat().st_size == len(data) and elf_problem(lib) is None  # rebuilt in place


# 4: the precompiled headers -----------------------------------------------------------------------------
def _pch_dir(cache: Path) -> Path:
    (ready,) = [d for d in (cache / "emulator-headers").iterdir() if not d.name.startswith(".")]
    return ready


@needs_gxx
@pytest.mark.parametrize("damage", ["truncated", "missing", "edited_copy", "unseen"])
def test_a_damaged_precompiled_header_heals(cache: Path, damage: str) -> None:
    _vadd(0)
    ready = _pch_dir(cache)
    gch = ready / pch_mod.PCH_NAME
    size = gch.stat().st_size
    if damage == "truncated":
        os.truncate(gch, size // 3)
    elif damage == "missing":
        gch.unlink()
    elif damage == "edited_copy":
        (ready / "sl_emu_launch.h").write_text("#error broken\n")
    else:  # cut short with its manifest updated to match: only the build that uses it can tell
        os.truncate(gch, size // 3)
        (ready / pch_mod.MANIFEST).write_text(f"{pch_mod._expected(ready, build._header_texts())}\n")
    _vadd(1)  # used to fail ("cannot read PCH file", "#error broken") in every later build
    if damage == "unseen":  # the failed build was retried with the package's headers; the copy is gone
        assert not ready.exists() and f"-I{build.HEADER_DIR}" in build.last_build_command
        _vadd(2)
    # precompiled again (its size varies from build to build), into a fresh directory swapped in
    assert gch.stat().st_size > size // 2 and pch_mod._intact(ready, build._header_texts())
    assert f"-I{ready}" in build.last_build_command and "-include" in build.last_build_command
    _vadd(3)
    assert f"-I{ready}" in build.last_build_command
    assert [d.name for d in (cache / "emulator-headers").iterdir() if d.name.startswith(".")] == []


# 6: a damaged cubin -------------------------------------------------------------------------------------
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
@pytest.mark.parametrize("damage", ["empty", "junk", "truncated"])
def test_a_damaged_cubin_is_rebuilt(cache: Path, damage: str) -> None:
    path = build_cubin(full(VADD), "sm_80")
    data = path.read_bytes()
    assert elf_problem(path) is None
    path.write_bytes({"empty": b"", "junk": b"not a cubin" * 100, "truncated": data[: len(data) // 2]}[damage])
    assert build_cubin(full(VADD), "sm_80") == path
    assert path.read_bytes() == data


# 8: working directories a killed process left -----------------------------------------------------------
def test_working_directories_of_dead_or_old_owners_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    def workdir(name: str, owner: str | None, age: float = 0.0) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "lib.so").write_bytes(b"x" * 100)
        if owner is not None:
            (d / OWNER_FILE).write_text(owner)
        then = time.time() - age
        os.utime(d, (then, then))
        return d

    host = socket.gethostname()
    gone = [workdir(".build-dead", f"{dead.pid} {host}\n"), workdir(".headers-old", None, STALE_AFTER_S + 60),
            workdir(".build-oldlive", f"{os.getpid()} {host}\n", STALE_AFTER_S + 60)]
    kept = [workdir(".build-live", f"{os.getpid()} {host}\n"), workdir(".headers-new", None),
            workdir(".build-elsewhere", f"{dead.pid} another-host\n"), workdir("0123abcd", None, STALE_AFTER_S + 60)]
    fresh = make_work_dir(tmp_path, ".build-")
    assert (fresh / OWNER_FILE).read_text().split() == [str(os.getpid()), host]
    assert [d.exists() for d in gone] == [False] * len(gone)
    assert all(d.exists() for d in kept)
