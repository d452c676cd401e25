"""Compiling a kernel source into an emulator shared library, cached per user by content hash.

The exact generated source is compiled by g++ against ``sl_cuda_emu.h`` together with a small
driver that exports one C entry point per launched kernel. The key covers everything that can
change the binary (source, driver, every emulator header, flags, compiler version), so a cached
library is never stale. Builds happen in a private temporary directory and are published with an
atomic rename, which keeps concurrent pytest-xdist workers from ever loading a half-written file.
A cached library that does not load (truncated by a full disk, replaced by hand) is deleted and
built again once, so a bad cache entry heals instead of failing every later run.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

from schedlib.cache import cache_dir, content_hash
from schedlib.errors import EmulatorError
from schedlib.runtime.elf import elf_problem
from schedlib.runtime.emulator.abi import ABI_VERSION
from schedlib.runtime.emulator.pch import discard as pch_discard
from schedlib.runtime.emulator.pch import header_flags
from schedlib.runtime.emulator.workdirs import make_work_dir

HEADER_DIR = Path(__file__).resolve().parent
# -O1: a kernel library compiles about 30% faster than at -O2 (5 kernels: 6.1 s against 8.5 s with a fresh
# cache) and runs as fast (a 256^3 fp16 matmul in 0.05-0.1 s either way): the compile is most of an emulated run
BASE_FLAGS = ("-O1", "-std=c++17", "-shared", "-fPIC", "-w")
BOUNDS_FLAG = "-DSL_EMU_BOUNDS"
# the bank census: checked pointers that log shared accesses; -g maps call sites to source lines
BANKS_FLAGS = ("-DSL_EMU_BOUNDS", "-DSL_EMU_BANKS", "-g")
BANKS_LIBS = ("-ldl",)  # dladdr, for call sites relative to the library
ENTRY_PREFIX = "sl_emu_launch__"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LOG_TAIL = 6000

_loaded: dict[Path, ctypes.CDLL] = {}
last_build_command: list[str] = []  # the g++ command of this process's latest successful library build
_load_lock = threading.Lock()


def find_gxx() -> str | None:
    """The g++ used to build emulator libraries: ``$SCHEDLIB_GXX`` if set, else ``g++`` on PATH."""
    env = os.environ.get("SCHEDLIB_GXX")
    if env:
        return shutil.which(env) or (env if os.access(env, os.X_OK) else None)
    return shutil.which("g++")


def require_gxx() -> str:
    """Like :func:`find_gxx` but raises a clear :class:`EmulatorError` when there is none."""
    gxx = find_gxx()
    if gxx is None:
        raise EmulatorError(
            "the CUDA emulator needs g++ (C++17) and none was found: install it (e.g. `apt-get install g++`) "
            "or point $SCHEDLIB_GXX at a g++ executable"
        )
    return gxx


@functools.lru_cache(maxsize=8)
def _gxx_version(gxx: str) -> str:
    """Part of the cache key, so a compiler upgrade never reuses libraries built by the old one."""
    try:
        out = subprocess.run([gxx, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:
        raise EmulatorError(f"cannot run {gxx}: {exc}") from exc
    return out.stdout.strip()


def _header_texts() -> list[str]:
    return [f"{p.name}\n{p.read_text()}" for p in sorted(HEADER_DIR.glob("*.h"))]


def check_kernel_names(source: str, names: Iterable[str]) -> list[str]:
    """Validate kernel names before compiling, so a typo is a one-line error, not a g++ log."""
    out = sorted(set(names))
    for name in out:
        if not _IDENT.match(name):
            raise EmulatorError(f"kernel name {name!r} is not a C identifier")
        if not re.search(rf"\b{re.escape(name)}\s*\(", source):
            raise EmulatorError(f"kernel {name!r} is not defined in the source (expected an extern \"C\" kernel)")
    return out


def driver_source(kernels: Iterable[str], *, banks: bool = False) -> str:
    """The translation unit g++ compiles: the exact source, then one C entry point per kernel (and, for the
    bank census, the calls that reset and read it)."""
    lines = [
        '#include "kernel.cu"',
        "#ifndef SL_EMU_ABI_VERSION",
        '#error "the source does not include sl_cuda_emu.h: it must start with the schedlib CUDA prelude"',
        "#endif",
        'extern "C" __attribute__((visibility("default"))) int sl_emu_abi_version() { return SL_EMU_ABI_VERSION; }',
    ]
    for name in kernels:
        lines.append(
            f'extern "C" __attribute__((visibility("default"))) int {ENTRY_PREFIX}{name}'
            "(const sl_emu_launch_t* L, char* err, unsigned long long errlen) "
            f'{{ return ::sl_emu::launch(&{name}, "{name}", L, err, errlen); }}'
        )
    if banks:
        export = 'extern "C" __attribute__((visibility("default")))'
        lines += [f"{export} void sl_emu_banks_reset(long long max_blocks) {{ ::sl_emu::banks_reset(max_blocks); }}",
                  f"{export} long long sl_emu_banks_report(char* out, unsigned long long capacity) "
                  "{ return ::sl_emu::banks_report(out, capacity); }"]
    return "\n".join(lines) + "\n"


def build_library(source: str, kernels: Iterable[str], *, bounds_check: bool, banks: bool = False) -> Path:
    """Compile (or find in the cache) the library for `source` exporting entry points for `kernels`;
    ``banks`` builds the bank census (which checks bounds too)."""
    gxx = require_gxx()
    names = check_kernel_names(source, kernels)
    driver = driver_source(names, banks=banks)
    if banks:
        flags, libs = [*BASE_FLAGS, *BANKS_FLAGS], list(BANKS_LIBS)
    else:
        flags, libs = [*BASE_FLAGS, *([BOUNDS_FLAG] if bounds_check else [])], []
    headers = _header_texts()
    key = content_hash(source, driver, *headers, " ".join(flags + libs), _gxx_version(gxx))
    root = cache_dir("emulator")
    target = root / f"{key}.so"
    try:
        inode: int | None = target.stat().st_ino
    except OSError:
        inode = None  # not built yet
    if inode is not None:
        try:
            load_library(target)  # proves the cached file usable; callers load it next, from _loaded
            return target
        except EmulatorError:
            _discard(target, inode)  # corrupt cache entry: build it once more below
    build = make_work_dir(root, ".build-")
    try:
        (build / "kernel.cu").write_text(source)
        (build / "driver.cpp").write_text(driver)
        identity = _gxx_version(gxx)
        include = header_flags(gxx, flags, headers, identity, HEADER_DIR)
        cmd = [gxx, *flags, *include, "driver.cpp", "-o", "lib.so", *libs]
        proc = _compile(cmd, build)
        pch = Path(include[0][2:]) if "-include" in include else None
        if proc.returncode != 0 and pch is not None and _pch_failed(proc.stderr, pch):
            # a damaged precompiled header (or header copy) fails every build that uses it: build once more
            # from the package's headers, and drop the copy if that works (if not, the source is at fault)
            plain = [gxx, *flags, f"-I{HEADER_DIR}", "driver.cpp", "-o", "lib.so", *libs]
            retry = _compile(plain, build)
            if retry.returncode == 0:
                pch_discard(pch)
            cmd, proc = plain, retry
        if proc.returncode != 0:
            log = (proc.stderr + proc.stdout).strip()
            raise EmulatorError(
                f"g++ failed to compile the kernel source for the emulator (exit {proc.returncode}); "
                f"command: {' '.join(cmd)}\n--- compiler log (tail) ---\n{log[-_LOG_TAIL:]}"
            )
        last_build_command[:] = cmd  # what tests read to see a build used the precompiled headers
        os.replace(build / "kernel.cu", root / f"{key}.cu")  # kept for debugging next to the library
        os.replace(build / "lib.so", target)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return target


def _pch_failed(log: str, pch: Path) -> bool:
    """Whether a failed build's log points at the precompiled-header copy (damaged, edited, or removed
    meanwhile by a concurrent process healing it) rather than at the kernel source alone."""
    return "PCH" in log or str(pch) in log or "sl_cuda_emu.h: No such file" in log


def _compile(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmulatorError(f"g++ could not build the emulator library: {exc}") from exc


def _discard(target: Path, inode: int) -> None:
    """Delete a cached library that did not load (and its source copy), unless a concurrent process
    has meanwhile published a fresh build under the same name (a different inode)."""
    try:
        if target.stat().st_ino == inode:
            target.unlink()
        target.with_suffix(".cu").unlink(missing_ok=True)
    except OSError:
        pass  # already gone: the rebuild publishes a new one either way


def _dlclose(handle: int) -> None:
    try:
        close = ctypes.CDLL(None).dlclose
    except (AttributeError, OSError):
        return  # best effort: without it only a new process can load a library rebuilt under this name
    close.argtypes = [ctypes.c_void_p]
    close(handle)


def load_library(path: Path) -> ctypes.CDLL:
    """dlopen a built library once per process, checking it speaks this module's launch ABI."""
    with _load_lock:
        lib = _loaded.get(path)
        if lib is None:
            lib = _open_checked(path)
            _loaded[path] = lib
        return lib


def _open_checked(path: Path) -> ctypes.CDLL:
    problem = elf_problem(path)  # dlopen of a file cut short can die of SIGBUS instead of failing
    if problem is not None:
        raise EmulatorError(f"cannot load emulator library {path}: it {problem}")
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    except OSError as exc:
        raise EmulatorError(f"cannot load emulator library {path}: {exc}") from exc
    try:
        version = lib.sl_emu_abi_version()
    except AttributeError:
        version = None
    if version != ABI_VERSION:
        # dlopen of a path already open returns the old handle, so close this one: otherwise a library
        # rebuilt under this name could not be loaded by this process.
        _dlclose(lib._handle)
        what = "does not export sl_emu_abi_version()" if version is None else f"speaks emulator ABI {version}"
        raise EmulatorError(f"emulator library {path} {what}; this schedlib expects ABI {ABI_VERSION}")
    return lib
