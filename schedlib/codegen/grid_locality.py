"""A value crosses from one CUDA block to another only through global memory, between kernel launches.

Within one kernel, every CUDA block runs its own iteration of each loop bound to ``blockIdx``.  A block that
reads what another wrote in the same kernel must therefore sit inside all of the writer's ``blockIdx`` loops:
then both run in the same CUDA block, over the same part of the data.  Attached outside one of them (a
shared-memory write-back put at the ``blockIdx.y`` loop of a tile split over ``blockIdx.x`` too), the reader
would cover parts that other CUDA blocks computed in their own shared memory, or, for a global buffer, read
them with no ordering between the blocks.  The reference executor runs loops in order and cannot see this,
so the build refuses it.
"""

from __future__ import annotations

from schedlib.errors import BuildError
from schedlib.ir.func import Block, Func


def _root(func: Func, block: Block) -> str:
    while block.attach is not None:
        block = func.block(block.attach.block)
    return block.name


def check_grid_locality(func: Func) -> None:
    """Refuse a reader placed outside a ``blockIdx`` loop of a writer of the same kernel."""
    for reader in func.blocks:
        around = {lp.name for lp in func.all_loops(reader)}
        for name in reader.read_buffers:
            if name in func.inputs:
                continue
            for writer in func.producers(name):
                if writer.name == reader.name or _root(func, writer) != _root(func, reader):
                    continue  # a kernel boundary orders them
                outside = [lp for lp in func.all_loops(writer)
                           if lp.thread is not None and lp.thread.startswith("blockIdx") and lp.name not in around]
                if outside:
                    lp = outside[0]
                    raise BuildError(
                        f"block {reader.name} reads {name} ({func.buffer(name).scope}), which {writer.name} "
                        f"writes inside loop {lp.name} bound to {lp.thread}; {reader.name} is not inside that "
                        f"loop, so it would read parts other CUDA blocks computed (in their own memory for a "
                        f"shared or local buffer, unordered for a global one).  Attach {reader.name} inside "
                        f"{lp.name}, or give it a kernel of its own")
