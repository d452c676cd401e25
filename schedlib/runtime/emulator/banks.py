"""Shared-memory bank conflicts of a kernel, counted on the CPU emulator.

The kernel runs in a checked build (``-DSL_EMU_BANKS``) that logs every shared-memory access with its call
site; each warp-wide request is then costed as the GPU serves it (``sl_emu_banks.h`` says how): the number of
wavefronts, against the ideal of one per phase. Each site comes back as a line of the kernel source.

Only the first ``blocks`` blocks of each launch run, so the outputs of a census are incomplete: it measures
access patterns, not results.  Sites are call sites in the compiled library, mapped to source lines with
``addr2line`` (binutils, installed with g++); where that fails the line is left empty.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedlib.errors import EmulatorError
from schedlib.runtime.emulator import KernelLaunch, checked_launches, os_threads, run_launches
from schedlib.runtime.emulator.build import build_library, load_library

_census_lock = threading.Lock()  # the census lives in the library: one run at a time per library


@dataclass(frozen=True)
class BankSite:
    """One shared-memory access in the kernel source, over every request the sampled blocks made."""

    kernel: str
    line: int | None  # 1-based line of the kernel source
    code: str  # that line, stripped
    buffer: str
    op: str  # "load/store", "vector load", "vector store", "ldmatrix.x4", "cp.async store", ...
    bytes: int  # per lane
    requests: int  # warp-wide requests
    wavefronts: int
    ideal: int  # one wavefront per phase: 32 lanes for accesses up to 4 bytes, 16 for 8, 8 for 16

    @property
    def conflict(self) -> float:
        """Wavefronts per ideal wavefront: 1.0 is conflict-free, 2.0 a two-way conflict on average."""
        return self.wavefronts / self.ideal if self.ideal else 1.0


def bank_census(
    source: str,
    launches: Sequence[KernelLaunch],
    args: Mapping[str, np.ndarray | int | float],
    *,
    blocks: int = 4,
    threads: int | None = None,
) -> list[BankSite]:
    """Run the first `blocks` blocks of each launch with shared accesses logged; one :class:`BankSite` per source
    line, buffer and operation (unrolled copies of one access are added together)."""
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise EmulatorError(f"bank census: blocks must be an int >= 1, got {blocks!r}")
    launches = checked_launches(launches)
    threads = os_threads(threads)
    if not launches:
        return []
    path = build_library(source, (ln.name for ln in launches), bounds_check=True, banks=True)
    lib = load_library(path)
    lib.sl_emu_banks_reset.argtypes = [ctypes.c_longlong]
    lib.sl_emu_banks_report.argtypes = [ctypes.c_char_p, ctypes.c_ulonglong]
    lib.sl_emu_banks_report.restype = ctypes.c_longlong
    with _census_lock:
        lib.sl_emu_banks_reset(blocks)
        run_launches(lib, launches, args, threads)
        report = _read_report(lib)
    return _sites(report, path, source)


def _read_report(lib: ctypes.CDLL) -> str:
    size = lib.sl_emu_banks_report(None, 0)
    buf = ctypes.create_string_buffer(size + 1)
    lib.sl_emu_banks_report(buf, size + 1)
    return buf.value.decode(errors="replace")


def _sites(report: str, library: Path, source: str) -> list[BankSite]:
    rows = [line.split("\t") for line in report.splitlines() if line]
    lines = source_lines(library, [int(r[0], 16) for r in rows])
    text = source.splitlines()
    merged: dict[tuple, list[int]] = {}
    for row, line in zip(rows, lines):
        _, kernel, buffer, op, nbytes, requests, wavefronts, ideal = row
        key = (kernel, line, buffer, op, int(nbytes))
        totals = merged.setdefault(key, [0, 0, 0])
        for i, value in enumerate((requests, wavefronts, ideal)):
            totals[i] += int(value)
    out = []
    for (kernel, line, buffer, op, nbytes), (requests, wavefronts, ideal) in merged.items():
        code = text[line - 1].strip() if line and line <= len(text) else ""
        out.append(BankSite(kernel, line, code, buffer, op, nbytes, requests, wavefronts, ideal))
    out.sort(key=lambda s: (s.kernel, s.line or 0, s.buffer, s.op))
    return out


def source_lines(library: Path, offsets: Sequence[int]) -> list[int | None]:
    """Kernel-source line of each call site (an offset into `library`, as a return address)."""
    tool = shutil.which("addr2line")
    if tool is None or not offsets:
        return [None] * len(offsets)
    # a return address points after the call; one byte back is inside it
    query = "\n".join(f"{max(offset - 1, 0):x}" for offset in offsets) + "\n"
    try:
        proc = subprocess.run([tool, "-e", str(library)], input=query, capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return [None] * len(offsets)
    answers = proc.stdout.splitlines()
    if proc.returncode != 0 or len(answers) != len(offsets):
        return [None] * len(offsets)
    return [_kernel_line(answer) for answer in answers]


def _kernel_line(answer: str) -> int | None:
    """``.../kernel.cu:123 (discriminator 2)`` -> 123; a line of any other file (or ``??:0``) -> None."""
    where = answer.split(" ", 1)[0]
    name, _, number = where.rpartition(":")
    if not name.endswith("kernel.cu") or not number.isdigit() or number == "0":
        return None
    return int(number)
