"""Compile-check generated CUDA source for a GPU architecture, without needing a GPU.

A kernel that the emulator accepts can still fail to compile for the GPU (an intrinsic the
emulator is lenient about, inline PTX needing a newer architecture) or use too many registers or
too much shared memory. ``compile_check`` builds SASS with ``nvcc -cubin --resource-usage`` (about
0.5 s) or, when nvcc is missing, with NVRTC through ``cupy.cuda.nvrtc`` (``-Xptxas=-v``; NVRTC
needs an explicit ``-arch`` and ``-I`` to the CUDA headers, and works with no GPU present), and
parses ptxas' per-kernel resource lines. Reports are cached as JSON by content hash.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from schedlib.cache import cache_dir, content_hash
from schedlib.errors import CompileError
from schedlib.runtime.elf import elf_problem

__all__ = ["CompileReport", "KernelResources", "check_arch", "compile_check", "find_cuda_include", "find_nvcc",
           "nvrtc_available"]

_ARCH = re.compile(r"sm_\d+[a-z]?\Z")
_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one kernel (entry function) on one architecture."""

    name: str
    registers: int
    shared_static_bytes: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    constant_bytes: int
    # Shared memory the launch asks for beyond the static arrays: ptxas cannot see it, so a report from a
    # Kernel fills it in from the kernel's launch (0 in a report of a bare source).
    shared_dynamic_bytes: int = 0


_RESOURCE_FIELDS = {f.name for f in fields(KernelResources)}
_PTXAS_FIELDS = _RESOURCE_FIELDS - {"shared_dynamic_bytes"}  # what reports cached before the field hold


@dataclass(frozen=True)
class CompileReport:
    """Resource usage of every kernel in a source, plus the full compiler log."""

    arch: str
    kernels: dict[str, KernelResources]
    log: str
    compiler: str = "nvcc"

    @property
    def registers(self) -> int:
        return max((k.registers for k in self.kernels.values()), default=0)

    @property
    def shared_static_bytes(self) -> int:
        return max((k.shared_static_bytes for k in self.kernels.values()), default=0)

    @property
    def shared_dynamic_bytes(self) -> int:
        return max((k.shared_dynamic_bytes for k in self.kernels.values()), default=0)

    @property
    def spill_bytes(self) -> int:
        return sum(k.spill_store_bytes + k.spill_load_bytes for k in self.kernels.values())


def find_nvcc() -> str | None:
    """nvcc from PATH, ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin`` or ``/usr/local/bin``."""
    found = shutil.which("nvcc")
    if found:
        return found
    dirs = [os.path.join(os.environ[v], "bin") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    for d in [*dirs, "/usr/local/cuda/bin", "/usr/local/bin"]:
        cand = os.path.join(d, "nvcc")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def find_cuda_include() -> str | None:
    """A directory holding ``cuda_fp16.h``, which NVRTC needs passed with -I."""
    roots = [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = find_nvcc()
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    for root in [*roots, "/usr/local/cuda"]:
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cuda_fp16.h")):
            return inc
    return None


def _nvrtc():  # cupy's nvrtc module, or None
    try:
        from cupy.cuda import nvrtc  # optional dependency

        nvrtc.getVersion()
    except Exception:  # any import/loader failure means "not available"
        return None
    return nvrtc


def nvrtc_available() -> bool:
    """True if NVRTC can be called (cupy plus an NVRTC library) and the CUDA headers are found."""
    return _nvrtc() is not None and find_cuda_include() is not None


@functools.lru_cache(maxsize=4)
def _nvcc_identity(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=120, check=False)
    return f"{nvcc}\n{out.stdout.strip()}"


@functools.lru_cache(maxsize=4)
def _nvcc_codes(nvcc: str) -> frozenset[str]:
    """The real architectures ``nvcc --list-gpu-code`` names (sm_75, sm_80, ...); empty where it cannot say."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(out.stdout.split()) if out.returncode == 0 else frozenset()


def check_arch(arch: Any, compiler: str | None = None) -> None:
    """A CompileError, before anything is compiled, when ``arch`` is no architecture name or the nvcc that
    would compile it cannot build it (nvcc 13 dropped sm_70): otherwise every kernel would fail alike, one by
    one.  With ``compiler="nvrtc"`` only the name is checked."""
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise CompileError(f"arch {arch!r} is not of the form sm_XY (e.g. sm_80, sm_90, sm_90a)")
    nvcc = find_nvcc() if compiler != "nvrtc" else None
    codes = _nvcc_codes(nvcc) if nvcc is not None else frozenset()
    if codes and arch.rstrip("abcdefghijklmnopqrstuvwxyz") not in codes:
        raise CompileError(f"{nvcc} cannot build {arch}: it builds {', '.join(sorted(codes, key=_arch_number))}")


def _arch_number(code: str) -> int:
    return int(re.sub(r"\D", "", code) or 0)


def parse_ptxas(log: str) -> dict[str, KernelResources]:
    """Per-entry resources from ptxas -v output (nvcc --resource-usage or NVRTC -Xptxas=-v)."""
    kernels: dict[str, KernelResources] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
        elif m := _PROPS.search(line):
            props = m.group(1)
        elif (m := _FRAME.search(line)) and props:
            frames[props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and entry:
            smem = _SMEM.search(line)
            frame = frames.get(entry, (0, 0, 0))
            kernels[entry] = KernelResources(
                name=entry,
                registers=int(m.group(1)),
                shared_static_bytes=int(smem.group(1)) if smem else 0,
                stack_frame_bytes=frame[0],
                spill_store_bytes=frame[1],
                spill_load_bytes=frame[2],
                constant_bytes=sum(int(c) for c in _CMEM.findall(line)),
            )
            entry = None
    return kernels


def _run_nvcc(nvcc: str, source: str, arch: str, flags: Sequence[str], emit: str = "cubin") -> tuple[str, bytes]:
    """(compiler log, output) of ``source`` for ``arch``: the cubin with ptxas' resource report, or the PTX."""
    with tempfile.TemporaryDirectory(prefix="schedlib-nvcc-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        out = Path(tmp) / f"kernel.{emit}"
        report = ["--resource-usage"] if emit == "cubin" else []
        cmd = [nvcc, f"-arch={arch}", f"-{emit}", *report, *flags, "-o", str(out), str(src)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompileError(f"nvcc could not run: {exc}") from exc
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed for {arch} (exit {proc.returncode}): {' '.join(cmd)}\n{log}")
        return log, out.read_bytes()


def _run_nvrtc(source: str, arch: str, flags: Sequence[str]) -> tuple[str, bytes]:
    nvrtc = _nvrtc()
    include = find_cuda_include()
    if nvrtc is None or include is None:
        raise CompileError("NVRTC is not usable: it needs cupy, the nvidia-cuda-nvrtc library and the CUDA headers")
    opts = [f"-arch={arch}", "-Xptxas=-v", f"-I{include}", *flags]
    prog = nvrtc.createProgram(source, "kernel.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as exc:
            raise CompileError(f"NVRTC failed for {arch} ({exc}):\n{nvrtc.getProgramLog(prog).strip()}") from None
        log = nvrtc.getProgramLog(prog).strip()
        return log, bytes(nvrtc.getCUBIN(prog))  # SASS must really have been produced for this arch
    finally:
        nvrtc.destroyProgram(prog)


def _compiler(arch: str, compiler: str | None) -> tuple[str | None, str, str]:
    """(nvcc path or None for NVRTC, the compiler's name, its identity for cache keys), or a CompileError."""
    check_arch(arch, compiler)
    if compiler not in (None, "nvcc", "nvrtc"):
        raise CompileError(f"compiler must be 'nvcc', 'nvrtc' or None, got {compiler!r}")
    nvcc = find_nvcc() if compiler in (None, "nvcc") else None
    if nvcc is None and compiler == "nvcc":
        raise CompileError("nvcc was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, /usr/local/bin)")
    if nvcc is None and not nvrtc_available():
        raise CompileError(
            "cannot compile CUDA: nvcc was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, /usr/local/bin) "
            "and NVRTC is not usable (needs cupy, the nvidia-cuda-nvrtc library and CUDA headers)"
        )
    if nvcc is not None:
        return nvcc, "nvcc", _nvcc_identity(nvcc)
    return None, "nvrtc", f"nvrtc {_nvrtc().getVersion()} {find_cuda_include()}"


def ptx(source: str, arch: str) -> str:
    """The PTX nvcc makes of ``source`` for ``arch`` (to read which instructions a kernel became: vector
    widths, local-memory traffic).  Needs nvcc: NVRTC is not asked, so the text is the one nvcc compiles."""
    nvcc, _, _ = _compiler(arch, "nvcc")
    _, text = _run_nvcc(nvcc, source, arch, [], emit="ptx")  # type: ignore[arg-type]
    return text.decode()


def build_cubin(source: str, arch: str, *, compiler: str | None = None) -> Path:
    """A cubin of ``source`` for ``arch`` (for architecture-specific targets such as sm_90a, which a JIT that
    picks the device's plain architecture cannot build), cached in the per-user cache by content."""
    nvcc, _, identity = _compiler(arch, compiler)
    path = cache_dir("cubin") / f"{content_hash(source, arch, identity)}.cubin"
    if path.is_file():
        if elf_problem(path) is None:
            return path
        path.unlink(missing_ok=True)  # damaged (empty, junk, cut short): nvdisasm and the driver would reject it
    _, cubin = _run_nvcc(nvcc, source, arch, []) if nvcc is not None else _run_nvrtc(source, arch, [])
    _write_atomic(path, cubin)
    return path


def compile_check(
    source: str, arch: str = "sm_90", *, extra_flags: Sequence[str] = (), compiler: str | None = None
) -> CompileReport:
    """Compile `source` to SASS for `arch` and report each kernel's resources.

    `compiler` is ``"nvcc"``, ``"nvrtc"`` or None (nvcc if found, else NVRTC). Raises
    :class:`CompileError` carrying the compiler log when the source does not compile, and a clear
    CompileError when no compiler is available.
    """
    nvcc, used, identity = _compiler(arch, compiler)
    flags = list(extra_flags)
    path = cache_dir("compile") / f"{content_hash(source, arch, json.dumps(flags), identity)}.json"
    cached = _load_report(path)
    if cached is not None:
        return cached
    log, _ = _run_nvcc(nvcc, source, arch, flags) if nvcc is not None else _run_nvrtc(source, arch, flags)
    report = CompileReport(arch=arch, kernels=parse_ptxas(log), log=log, compiler=used)
    _write_atomic(path, json.dumps(asdict(report)).encode())
    return report


def _report_from_json(data: Any) -> CompileReport | None:
    """The report a cache file holds, or None unless every field has the type this module writes."""
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
        return None
    if not all(isinstance(data.get(k), str) for k in ("arch", "log", "compiler")):
        return None
    kernels = {}
    for name, k in data["kernels"].items():
        if not isinstance(k, dict) or k.keys() not in (_RESOURCE_FIELDS, _PTXAS_FIELDS) or k["name"] != name:
            return None
        counts = [k[f] for f in k if f != "name"]
        if not all(type(c) is int and c >= 0 for c in counts):
            return None
        kernels[name] = KernelResources(**k)
    return CompileReport(arch=data["arch"], kernels=kernels, log=data["log"], compiler=data["compiler"])


def _load_report(path: Path) -> CompileReport | None:
    """A cached report, or None to compile again; a malformed cache file is deleted so it is rewritten."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # unreadable or not UTF-8
        report = None
    else:
        try:
            report = _report_from_json(json.loads(text))
        except (ValueError, RecursionError):
            report = None
    if report is None:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass  # the rewrite after compiling will report what is wrong with the path
    return report


def _write_atomic(path: Path, data: bytes) -> None:
    """Publish ``data`` under ``path`` in one rename, so no reader (another process included) ever
    sees a partial file; the temporary name is unique, so concurrent writers never clash."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
