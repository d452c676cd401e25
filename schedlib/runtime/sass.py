"""What the GPU will really execute: a kernel's SASS, and the instruction mix of each of its loops.

PTX says what nvcc was asked for; ptxas still unrolls, merges, hoists and schedules.  The SASS of a loop body
shows the cost a schedule pays per iteration: how many of its instructions are the work (FFMA, HMMA, HGMMA)
and how many feed it (loads, address arithmetic, barriers, branches).  A SIMT matmul whose k loop is 90%
FFMA is issue-efficient; one at 60% is not, whatever its tile says.

The disassembler is NVIDIA's ``nvdisasm``.  It is looked for in ``$SCHEDLIB_NVDISASM``, on ``PATH``, next to
nvcc, and in the ``nvidia-cuda-nvdisasm`` wheel (``pip install nvidia-cuda-nvdisasm``; the test extras
install it).  Nothing here needs a GPU.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from schedlib.errors import CompileError
from schedlib.runtime.nvcc import find_nvcc

__all__ = ["CATEGORIES", "SassInstruction", "SassLoop", "disassemble", "find_nvdisasm", "loop_mix", "loops",
           "parse"]

# Opcode families by what they do for the kernel, matched on the opcode before its first modifier.
CATEGORIES: dict[str, frozenset[str]] = {
    "tensor": frozenset({"HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA", "BGMMA", "DMMA", "UTCHMMA"}),
    "fp": frozenset({"FFMA", "FMUL", "FADD", "FMNMX", "FSWZADD", "HFMA2", "HADD2", "HMUL2", "HMNMX2", "DFMA",
                     "DADD", "DMUL", "MUFU", "FCHK"}),
    "global": frozenset({"LDG", "STG", "LDGSTS", "LDGDEPBAR", "UTMALDG", "UTMASTG", "UTMAPF", "UBLKCP", "RED",
                         "ATOMG", "LD", "ST"}),
    "shared": frozenset({"LDS", "STS", "LDSM", "STSM", "ATOMS", "LDSU"}),
    "local": frozenset({"LDL", "STL"}),
    "sync": frozenset({"BAR", "SYNCS", "WARPSYNC", "DEPBAR", "WARPGROUP", "MEMBAR", "ERRBAR", "ARRIVES",
                       "WARPGROUPSET"}),
    "control": frozenset({"BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BSSY", "BSYNC", "BREAK", "YIELD",
                          "NOP", "ELECT"}),
}
_FAMILY = {op: name for name, ops in CATEGORIES.items() for op in ops}

_SECTION = re.compile(r"^\s*\.text\.(\S+):\s*$")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):\s*$")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+\{?\s*(?:(@!?U?P[T0-9]+)\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_BRANCHES = frozenset({"BRA", "BRX", "JMP"})


@dataclass(frozen=True)
class SassInstruction:
    """One instruction: byte offset in its kernel, guard predicate (``""`` when none), opcode with its
    modifiers (``LDG.E.128.CONSTANT``) and operands."""

    offset: int
    predicate: str
    opcode: str
    operands: str

    @property
    def base(self) -> str:
        """The opcode without modifiers: ``LDG``."""
        return self.opcode.split(".", 1)[0]

    @property
    def family(self) -> str:
        """One of :data:`CATEGORIES`' keys, or ``"other"`` (integer arithmetic, moves, conversions)."""
        return _FAMILY.get(self.base, "other")


@dataclass(frozen=True)
class SassLoop:
    """A loop body: the instructions from a label to the branch that jumps back to it."""

    kernel: str
    start: int  # byte offset of the first instruction
    end: int  # byte offset of the backward branch
    body: tuple[SassInstruction, ...]
    innermost: bool  # holds no other loop

    def counts(self) -> collections.Counter[str]:
        """Instructions per opcode family."""
        return collections.Counter(i.family for i in self.body)

    def opcodes(self) -> collections.Counter[str]:
        """Instructions per base opcode."""
        return collections.Counter(i.base for i in self.body)


def find_nvdisasm() -> str | None:
    """Path of an ``nvdisasm`` executable, or None (see the module docstring for where it is looked for)."""
    env = os.environ.get("SCHEDLIB_NVDISASM")
    if env:
        return env if os.access(env, os.X_OK) else None
    on_path = shutil.which("nvdisasm")
    if on_path:
        return on_path
    nvcc = find_nvcc()
    if nvcc:
        beside = Path(os.path.realpath(nvcc)).parent / "nvdisasm"
        if os.access(beside, os.X_OK):
            return str(beside)
    spec = importlib.util.find_spec("nvidia")  # the wheel installs nvidia/cu<N>/bin/nvdisasm
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob("*/bin/nvdisasm"), reverse=True):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def disassemble(cubin: str | Path) -> str:
    """``nvdisasm -c`` of a cubin file: the SASS text of every kernel in it."""
    tool = find_nvdisasm()
    if tool is None:
        raise CompileError("nvdisasm not found: install it with 'pip install nvidia-cuda-nvdisasm', put it on "
                           "PATH, or point SCHEDLIB_NVDISASM at it")
    proc = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise CompileError(f"nvdisasm failed on {cubin}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def parse(text: str) -> dict[str, tuple[list[SassInstruction], dict[str, int]]]:
    """Per kernel: its instructions in order, and each label's index into them."""
    kernels: dict[str, tuple[list[SassInstruction], dict[str, int]]] = {}
    current: tuple[list[SassInstruction], dict[str, int]] | None = None
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            current = kernels.setdefault(section.group(1), ([], {}))
            continue
        if current is None:
            continue
        label = _LABEL.match(line)
        if label:
            current[1][label.group(1)] = len(current[0])
            continue
        ins = _INSTRUCTION.match(line)
        if ins:
            offset, predicate, opcode, operands = ins.groups()
            current[0].append(SassInstruction(int(offset, 16), predicate or "", opcode, operands.strip()))
    return kernels


def loops(text: str) -> list[SassLoop]:
    """Every loop of every kernel in ``text`` (``nvdisasm -c`` output): a branch back to an earlier label
    closes one.  Loops come in kernel order, then by start offset."""
    found: list[SassLoop] = []
    for kernel, (instructions, labels) in parse(text).items():
        spans = []
        for k, ins in enumerate(instructions):
            target = _TARGET.search(ins.operands) if ins.base in _BRANCHES else None
            head = labels.get(target.group(1)) if target else None
            if head is not None and head <= k:
                spans.append((head, k))
        spans = sorted(set(spans))
        for head, tail in spans:
            if head == tail:  # the branch-to-self that ends every kernel, after its exits
                continue
            inner = any((h, t) != (head, tail) and head <= h and t <= tail for h, t in spans)
            found.append(SassLoop(kernel, instructions[head].offset, instructions[tail].offset,
                                  tuple(instructions[head:tail + 1]), not inner))
    return found


def loop_mix(text: str, innermost_only: bool = True) -> pd.DataFrame:
    """One row per loop of ``text`` (``nvdisasm -c`` output): where it is, its instructions by family
    (:data:`CATEGORIES`), ``math_share`` (tensor and floating-point instructions over all of them) and its
    most frequent opcodes."""
    rows = []
    for loop in loops(text):
        if innermost_only and not loop.innermost:
            continue
        counts = loop.counts()
        n = len(loop.body)
        rows.append({"kernel": loop.kernel, "start": f"0x{loop.start:04x}", "end": f"0x{loop.end:04x}",
                     "innermost": loop.innermost, "instructions": n,
                     **{family: counts.get(family, 0) for family in (*CATEGORIES, "other")},
                     "math_share": (counts.get("tensor", 0) + counts.get("fp", 0)) / n,
                     "top": ", ".join(f"{op} {k}" for op, k in loop.opcodes().most_common(6))})
    columns = ["kernel", "start", "end", "innermost", "instructions", *CATEGORIES, "other", "math_share", "top"]
    return pd.DataFrame(rows, columns=columns)
