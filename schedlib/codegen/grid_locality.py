"""A value crosses from one CUDA block to another only through global memory, between kernel launches.

Within one kernel, every CUDA block runs its own iteration of each loop bound to ``blockIdx``.  A block that
reads what another wrote in the same kernel must therefore sit inside all of the writer's ``blockIdx`` loops:
then both run in the same CUDA block, over the same part of the data.  Attached outside one of them (a
shared-memory write-back put at the ``blockIdx.y`` loop of a tile split over ``blockIdx.x`` too), the reader
would cover parts that other CUDA blocks computed in their own shared memory, or, for a global buffer, read
them with no ordering between the blocks.  The reference executor runs loops in order and cannot see this,
so the build refuses it.  Registers (local buffers) are private to each thread in the same way: a reader
outside a thread loop that spread the writer's outputs over the threads is refused too.  Loops of extent 1
hold one iteration for everyone and are left out.

Two writers of one global buffer in one kernel obey the same rule: a writer outside a ``blockIdx`` loop of the
other runs in every CUDA block, over the parts the other blocks write (an init split off by
``decompose_reduction`` above the ``blockIdx`` loop of its update zeroes the other blocks' sums: the emulator,
which runs the blocks one after another, gave 0 for them; a GPU races).  Shared and local buffers are each
block's own, so only global ones are checked.
"""

from __future__ import annotations

from schedlib.codegen.tensor_core import is_tensor_core_root
from schedlib.errors import BuildError
from schedlib.ir.expr import as_int
from schedlib.ir.func import Func


def check_grid_locality(func: Func) -> None:
    """Refuse a reader placed outside a ``blockIdx`` loop of a writer of the same kernel, or, for a local
    buffer, outside a spatial ``threadIdx`` loop of its writer; and a writer of a global buffer outside a
    ``blockIdx`` loop of another writer of it in the same kernel."""
    _check_writers(func)
    for reader in func.blocks:
        around = {lp.name for lp in func.all_loops(reader)}
        for name in reader.read_buffers:
            if name in func.inputs:
                continue
            # (not in a tensor-core kernel: its accumulator is lowered as mma fragments, each lane writing back
            # what it holds)
            local = func.buffer(name).scope == "local" and not is_tensor_core_root(func.root_of(reader))
            for writer in func.producers(name):
                if writer.name == reader.name or func.root_of(writer) is not func.root_of(reader):
                    continue  # a kernel boundary orders them
                for lp in func.all_loops(writer):
                    if lp.thread is None or lp.name in around or as_int(lp.extent) == 1:
                        continue
                    if lp.thread.startswith("blockIdx"):
                        raise BuildError(
                            f"block {reader.name} reads {name} ({func.buffer(name).scope}), which {writer.name} "
                            f"writes inside loop {lp.name} bound to {lp.thread}; {reader.name} is not inside that "
                            f"loop, so it would read parts other CUDA blocks computed (in their own memory for a "
                            f"shared or local buffer, unordered for a global one).  Attach {reader.name} inside "
                            f"{lp.name}, or give it a kernel of its own")
                    # Registers are private to a thread: a reader outside a thread loop that spreads the writer's
                    # outputs (a spatial one; a cross-thread reduction leaves its result in every thread) would
                    # read other threads' results from its own registers.
                    if local and writer.loop_kind(lp.name) == "S":
                        raise BuildError(
                            f"block {reader.name} reads the registers {name}, which {writer.name} fills inside "
                            f"loop {lp.name} bound to {lp.thread}, each thread its own part; {reader.name} is "
                            f"not inside that loop, so each thread would read parts only other threads hold.  "
                            f"Attach {reader.name} inside {lp.name}, or use shared memory")


def _check_writers(func: Func) -> None:
    """Refuse a global buffer's writer that runs in every CUDA block (outside a ``blockIdx`` loop) while another
    writer of the same kernel splits the buffer over those blocks (inside it)."""
    for buf in func.buffers:
        if buf.scope != "global" or buf.name in func.inputs:
            continue
        writers = func.producers(buf.name)
        for inner in writers:
            for outer in writers:
                if outer.name == inner.name or func.root_of(outer) is not func.root_of(inner):
                    continue
                around = {lp.name for lp in func.all_loops(outer)}
                for lp in func.all_loops(inner):
                    if lp.thread is None or not lp.thread.startswith("blockIdx") or lp.name in around \
                            or as_int(lp.extent) == 1:
                        continue
                    raise BuildError(
                        f"block {outer.name} writes {buf.name} (global) outside loop {lp.name} bound to {lp.thread}, "
                        f"inside which {inner.name} writes it too: every CUDA block would run {outer.name} over the "
                        f"parts the other blocks write, with no order between them.  Attach {outer.name} inside "
                        f"{lp.name} (decompose_reduction at a loop inside it), or give it a kernel of its own")
