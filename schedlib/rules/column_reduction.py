"""The column layout of the GeneralReduction rule: a softmax or norm over an axis that is not the contiguous one
(``softmax(X, dim=0)``, a norm over the middle axis of ``X[b, k, n]``).

One thread per column would read coalesced but leave few threads when the columns are few, and walk a whole
column serially.  Here a block owns ``threads_n`` neighbouring columns (threadIdx.x, so each row segment is
read by one coalesced request) and ``threads_k`` threads (threadIdx.y) split the reduced axis; each reduction
combines across them through shared memory and leaves its per-column result in a register of every thread of
the column.  Each thread walks its share of the column ``unroll`` rows at a time, so that many independent
loads are in flight: a block holds few columns, and without them it waits one memory latency per row.

Before::

    for j in range(N):                       # kept (columns)
      for k in range(K):  T_max[j] max= X[k, j]
    for j in range(N):
      for k in range(K):  T_sum[j] += exp(X[k, j] - T_max[j])
    for i in range(K):
      for j in range(N):  Y[i, j] = exp(X[i, j] - T_max[j]) / T_sum[j]

After (``threads_n`` = TN, ``threads_k`` = TK, ``unroll`` = U)::

    for jo in range(N / TN):                 # blockIdx.x
      for jt in range(TN):                   # threadIdx.x
        for kt in range(TK):                 # threadIdx.y, combined through shared memory
          for ko in range(K / (U * TK)):
            for ku in range(U):  T_max_local max= X[(ko * U + ku) * TK + kt, j]     # unrolled
        ... T_sum alike ...
        for kt in range(TK):                 # threadIdx.y
          for ko, ku:  Y[i, j] = exp(X[i, j] - T_max_local) / T_sum_local
"""

from __future__ import annotations

from typing import Any

from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.base import Config, Knob, Space, Tiling, pow2_range
from schedlib.rules.cross_thread import threads_within
from schedlib.rules.general_reduction_facts import GeneralReductionFacts, inlined_schedule

# One warp along the columns (a 128-byte line of fp32 per row read), 32 warps splitting the column, 8 rows
# per thread loaded before use: 8192 loads in flight per block of 32 columns.  Of the points tried, the
# carver ranks it first or tied-first for softmax, RMSNorm and LayerNorm over 128 to 32000 rows and 1024 to
# 32000 columns on the h100 profile (16 warps x 4 rows was up to 3x slower in its model where the columns
# are short, waiting on memory).
COLUMN_DEFAULT = {"threads_n": 32, "threads_k": 32, "unroll": 8}


def column_space(rule: str, target: Any) -> Space:
    return Space(rule, (Knob("threads_n", pow2_range(32, 256), "neighbouring columns per block (threadIdx.x)"),
                        Knob("threads_k", (1, 2, 4, 8, 16, 32), "threads splitting each column (threadIdx.y)"),
                        Knob("unroll", (1, 2, 4, 8), "rows each thread loads before folding them")),
                 threads_within(target.max_threads_per_block))


def column_default(func: Func, facts: GeneralReductionFacts, target: Any) -> Config:
    """:data:`COLUMN_DEFAULT`, with fewer threads per column where the column is short."""
    config = dict(COLUMN_DEFAULT)
    while config["threads_k"] > 1 and config["threads_k"] * config["unroll"] > facts.cols:
        config["threads_k"] //= 2
    return config


def column_tiling(func: Func, facts: GeneralReductionFacts, config: Config) -> Tiling:
    """A block covers ``threads_n`` columns whole; a step reads ``threads_k * unroll`` rows of them."""
    out = func.block(facts.output)
    names = [a.name for a in out.axes]
    reduced = names[facts.axis]
    tile = {n: 1 for n in names} | {names[-1]: config["threads_n"], reduced: facts.cols}
    threads = config["threads_n"] * config["threads_k"]
    rereads = {} if facts.row_input is None else {facts.row_input: facts.row_passes - 1}
    return Tiling(facts.output, tile, {names[-1]: 1}, {reduced: config["threads_k"] * config["unroll"]}, threads,
                  4 * threads, 32 + config["unroll"], 1, rereads=rereads)


def schedule_columns(func: Func, facts: GeneralReductionFacts, config: Config) -> Schedule:
    TN, TK, U = config["threads_n"], config["threads_k"], config["unroll"]
    s, _ = inlined_schedule(func, facts)  # (the column layout stores no further outputs: no copies)
    loops = s.get_loops(facts.output)
    k = loops[facts.axis]
    kept = [lp for d, lp in enumerate(loops) if d != facts.axis]
    s.reorder(*kept, k)
    col = s.fuse(*kept) if len(kept) > 1 else kept[0]
    bx, tx = s.split(col, [None, TN])
    _split_column(s, k, TK, U)
    s.bind(bx, "blockIdx.x")
    s.bind(tx, "threadIdx.x")
    for name in reversed(facts.reductions):
        s.compute_at(name, tx)
        _split_column(s, s.get_loops(name)[-1], TK, U)
    return s


def _split_column(s: Schedule, loop: str, threads: int, unroll: int) -> None:
    """``loop`` -> (threads over threadIdx.y, steps, ``unroll`` rows per step, unrolled): a thread's rows are
    ``threads`` apart, so each row segment is read by a whole block row at once."""
    ko, ku, kt = s.split(loop, [None, unroll, threads])
    s.reorder(kt, ko, ku)
    s.bind(kt, "threadIdx.y")
    if unroll > 1:
        s.unroll(ku)
    # The steps stay a loop: unrolled by ptxas as well (a column of two steps), their element-wise divisions'
    # slow-path calls had 12 B spilled around them (3 x 40 x 5 and 3 x 300 x 5 softmaxes over the middle axis).
    s.annotate(ko, "unroll_limit", 1)
