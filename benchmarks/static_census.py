"""What the GPU suite's kernels look like to the compiler, without a GPU: memory instructions, registers, spills,
shared-memory bank conflicts.

    python3 benchmarks/static_census.py [--target h100] [--out DIR] [--only gemv_fp16_inner softmax_4096]
                                        [--no-banks]

For every workload of ``gpu_suite.SUITE`` the rule default for the target's hardware profile is built and
compiled with nvcc for the profile's architecture (sm_90a for wgmma kernels): the PTX is read
for its global and shared memory instructions (static counts in the kernel bodies, by access width), and
ptxas for registers and spill bytes per kernel.  A memory-bound kernel should show 16-byte (``v4``) global
accesses and no ``.local`` traffic; a scalar ``u16``/``f32`` column there is a kernel that moves its bytes
with several times the instructions it needs.  ``bank_conflict`` is the worst shared-memory access of the
kernel's first block on the CPU emulator (``Kernel.bank_conflicts``: wavefronts per ideal wavefront, 1.0 is
conflict-free), as the source writes it; nvcc may still merge scalar accesses, which the PTX columns show.
``main_loop`` (when nvdisasm is installed: ``pip install nvidia-cuda-nvdisasm``) is the SASS loop doing the
most arithmetic: its instructions per iteration, the share that is arithmetic, and its commonest opcodes.
This is a check of the generated code, not a timing: the times come from ``gpu_suite.py`` on a device.
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_suite import SUITE
from script_args import Parser, writable_dir

import schedlib as sl
from schedlib.errors import SchedlibError
from schedlib.ir.dtype import numpy_dtype
from schedlib.ir.expr import as_int
from schedlib.report import markdown_table
from schedlib.runtime.emulator import find_gxx
from schedlib.runtime.nvcc import find_nvcc, ptx
from schedlib.runtime.sass import find_nvdisasm
from schedlib.suites import WorkloadSpec

MEMORY_OP = re.compile(r"\b(ld|st)\.(global|shared|local)((?:\.nc)?(?:\.v[248])?\.[a-z]+\d+)")


def memory_instructions(ptx: str) -> dict[str, int]:
    """``{"ld.global.v4.u32": n, ...}``: static counts of each memory instruction form in ``ptx``."""
    counts: collections.Counter[str] = collections.Counter()
    for op, space, form in MEMORY_OP.findall(ptx):
        counts[f"{op}.{space}{form.replace('.nc', '')}"] += 1
    return dict(counts)


def census(spec: WorkloadSpec, target: str, banks: bool = True) -> dict[str, object]:
    func = spec.build()
    kernel = sl.build(sl.rules.apply_default(func, target), target)
    resources = kernel.compile_check()
    ops = memory_instructions(ptx(kernel.source, resources.arch))
    kernels = resources.kernels.values()
    return {
        "workload": spec.name,
        "arch": resources.arch,
        "kernels": len(kernels),
        "registers": max(r.registers for r in kernels),
        "spill_bytes": sum(r.spill_load_bytes + r.spill_store_bytes for r in kernels),
        "global_loads": _forms(ops, "ld.global"),
        "global_stores": _forms(ops, "st.global"),
        "shared_loads": _forms(ops, "ld.shared"),
        "local": sum(n for k, n in ops.items() if ".local" in k),
        **({"bank_conflict": worst_bank_conflict(kernel)} if banks else {}),
        **({"main_loop": main_loop(kernel)} if find_nvdisasm() is not None else {}),
    }


def main_loop(kernel: sl.Kernel) -> str:
    """``"560 instr, 91% math: FFMA 512, LDS 32, IADD3 5"``: the SASS loop with the most arithmetic (tensor and
    floating-point instructions), its size, its arithmetic share (the count of tensor-core instructions
    where it has them) and its three most frequent opcodes."""
    loops = kernel.loop_mix(innermost_only=False)
    if loops.empty:
        return "no loop"
    hot = loops.loc[(loops["tensor"] + loops["fp"]).idxmax()]
    top = ", ".join(hot["top"].split(", ")[:3])
    if hot["tensor"]:  # one wgmma/mma is a whole tile of work: count them rather than their share
        return f"{hot['instructions']} instr, {hot['tensor']} tensor-core: {top}"
    return f"{hot['instructions']} instr, {hot['math_share']:.0%} math: {top}"


def worst_bank_conflict(kernel: sl.Kernel) -> str:
    """``"2.0 (B_shared vector load)"`` for the worst shared access of the first block; ``"-"`` with none."""
    func = kernel.func
    inputs = [np.zeros([as_int(d) for d in func.buffer(n).shape], numpy_dtype(func.buffer(n).dtype))
              for n in func.inputs]  # the census looks at addresses only
    sites = kernel.bank_conflicts(*inputs, blocks=1)
    if sites.empty:
        return "-"
    worst = sites.iloc[0]
    return f"{worst['conflict']:.1f} ({worst['buffer']} {worst['op']})"


def _forms(ops: dict[str, int], prefix: str) -> str:
    """``"4 v4.u32, 1 u16"``: how many of each access form start with ``prefix``."""
    return ", ".join(f"{n} {k[len(prefix) + 1:]}" for k, n in sorted(ops.items()) if k.startswith(prefix)) or "-"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="static_census.py", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h100", help="hardware profile the rules schedule for (default h100)")
    ap.add_argument("--out", help="also write census.md and census.csv to this folder")
    ap.add_argument("--only", nargs="+", metavar="WORKLOAD", help="these workloads of the suite (default: all)")
    ap.add_argument("--no-banks", action="store_true",
                    help="skip the bank census (it runs each kernel's first block on the CPU emulator)")
    args = ap.parse_args(argv)
    names = {s.name for s in SUITE}
    wanted = args.only or sorted(names)
    unknown = sorted(set(wanted) - names)
    if unknown:
        ap.error(f"unknown workloads {', '.join(unknown)}; the suite has {', '.join(sorted(names))}")
    try:  # checked before the compiles: a misspelt target would otherwise fail the first workload
        sl.hw.resolve(args.target)
    except (SchedlibError, ValueError, LookupError) as exc:
        ap.error(f"--target: {exc}")
    out = writable_dir(ap, args.out) if args.out else None  # before the work, not after it
    if find_nvcc() is None:
        ap.error("needs nvcc (on PATH, or $CUDA_HOME/bin)")
    banks = not args.no_banks
    if banks and find_gxx() is None:
        ap.error("the bank census needs g++ for the CPU emulator (or pass --no-banks)")
    rows = []
    for spec in SUITE:
        if spec.name in wanted:
            print(f"compiling {spec.name} ...", file=sys.stderr, flush=True)
            rows.append(census(spec, args.target, banks))
    table = pd.DataFrame(rows)
    text = markdown_table(table)
    print(text)
    if out is not None:
        (out / "census.md").write_text(text + "\n")
        table.to_csv(out / "census.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
