"""GeneralReduction rule: softmax, layernorm, RMSNorm and kin, recognised by structure.

Pattern (:mod:`schedlib.rules.general_reduction_facts`): the output block is element-wise over (rows...,
cols); every other stage is either a reduction over ``cols`` that keeps the rows, or element-wise over the
output's shape.  A reduction over another axis (``softmax(X, dim=0)``) takes the column layout instead, with
its own knobs (:mod:`schedlib.rules.column_reduction`).  The row layout gives one thread block per row:
element-wise intermediates are inlined (recomputed where used), every reduction keeps its per-row result
in a register (cache_write local, then the copy is inlined away) and reduces across the row's threads.  A
row statistic that is also a func output (a layer norm's mean and rstd, a softmax's row max) is stored once
per row where it is computed, and read back into a register after a barrier; one that nothing reads (a
row's sum beside its sum of squares, a log-sum-exp beside the softmax) runs beside the row's other stages
(``compute_with``).

Each pass over the row (softmax: max, sum, output) reads the input again, from L1 or L2 when the rows in
flight fit there.  The ``stage_row`` knob instead copies the row into shared memory once, 16 bytes per
thread and step, and every pass reads it there: global traffic drops to the compulsory bytes, at the
price of a row's worth of shared memory per block (fewer blocks per SM).  Which wins depends on the row
length and the card's L2, so it is a knob for the carver and the search, not a fixed choice.
"""

from __future__ import annotations

import functools
from typing import Any

from schedlib.hw import HardwareProfile
from schedlib.ir.func import Func
from schedlib.ir.schedule import Schedule
from schedlib.rules.analysis import ceil_pow2
from schedlib.rules.base import Config, Knob, Rule, Space, Tiling, pow2_range
from schedlib.rules.column_reduction import column_default, column_space, column_tiling, schedule_columns
from schedlib.rules.general_reduction_facts import (
    GeneralReductionFacts,
    analyze_general_reduction,
    inlined_schedule,
)

# A staged row's copy loop is unrolled up to this many steps, so that its loads are all in flight at once.
MAX_UNROLLED_COPY_STEPS = 16


class GeneralReductionRule(Rule):
    name = "general_reduction"

    def analyze(self, func: Func, target: HardwareProfile) -> GeneralReductionFacts | str:
        return analyze_general_reduction(func)

    def _facts(self, func: Func) -> GeneralReductionFacts:
        return self._require(analyze_general_reduction(func))

    def space(self, func: Func, target: Any) -> Space:
        facts = self._facts(func)
        if facts.column:
            return column_space(self.name, target)
        limit = target.max_threads_per_block
        return Space(self.name, (
            Knob("threads", pow2_range(32, limit), "threads per row (one thread block per row)"),
            Knob("unroll", (1, 2, 4, 8), "consecutive elements each thread handles per step (one vector access "
                 "when aligned and at most 16 bytes)"),
            Knob("stage_row", (False, True), "copy the row into shared memory once; every pass reads it there"),
        ), check=functools.partial(_check, facts, target))

    def default_config(self, func: Func, target: Any) -> Config:
        """About 8 columns per thread; each step a 16-byte run per thread where the row holds enough of them
        (4 fp32 or 8 fp16 columns), else 4 columns, else 1."""
        facts = self._facts(func)
        if facts.column:
            return column_default(func, facts, target)
        threads = min(max(32, min(1024, ceil_pow2(-(-facts.cols // 8)))), target.max_threads_per_block)
        unroll = next((u for u in (16 // facts.in_bytes, 4) if u <= 8 and facts.cols >= u * threads), 1)
        config = {"threads": threads, "unroll": unroll, "stage_row": False}
        return config | {"stage_row": True} if _rows_outgrow_l1(facts, target, config) else config

    def tiling(self, func: Func, target: Any, config: Config) -> Tiling:
        facts = self._facts(func)
        if facts.column:
            return column_tiling(func, facts, config)
        out = func.block(facts.output)
        tile = {a.name: 1 for a in out.axes[:-1]} | {out.axes[-1].name: facts.cols}
        staged = bool(config.get("stage_row")) and facts.row_input is not None
        row_bytes = (facts.row_bytes or 0) if staged else 0
        rereads = {} if facts.row_input is None else {facts.row_input: facts.row_passes - 1}
        return Tiling(facts.output, tile, {}, {out.axes[-1].name: config["threads"] * config["unroll"]},
                      config["threads"], 4 * config["threads"] + row_bytes, _registers(config["threads"]),
                      _vector_width(config["unroll"], facts.in_bytes),
                      shared_buffers=(facts.row_input,) if staged else None, rereads=rereads)

    def schedule(self, func: Func, facts: GeneralReductionFacts, config: Config,
                 target: HardwareProfile) -> Schedule:
        if facts.column:
            return schedule_columns(func, facts, config)
        s, copies = inlined_schedule(func, facts)
        T, U = config["threads"], config["unroll"]
        vectorize = _vector_width(U, facts.in_bytes) > 1
        loops = s.get_loops(facts.output)
        row = s.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        s.bind(row, "blockIdx.x")
        ju = None
        if func.block(facts.output).reducer is not None:  # statistics only: the last reduction leads the row
            _spread_reduction(s, loops[-1], T, U, vectorize)
        else:
            jo, jt, ju = s.split(loops[-1], [None, T, U]) if U > 1 else (*s.split(loops[-1], [None, T]), None)
            s.reorder(row, jt, jo)
            s.bind(jt, "threadIdx.x")
        # the row's own stages in order (reverse placement): statistics stored as outputs, their read-backs
        per_row = {*facts.row_stages, *copies, *facts.reductions}
        for name in reversed([b for b in s.blocks if b in per_row]):
            (s.compute_with if name in facts.side_by_side else s.compute_at)(name, row)
            if name in facts.reductions:
                _spread_reduction(s, s.get_loops(name)[-1], T, U, vectorize)
        if ju is not None:
            (s.vectorize if vectorize else s.unroll)(ju)
        if config.get("stage_row"):
            _stage_row(s, facts, row, T, U, vectorize)
        return s


def _spread_reduction(s: Schedule, k: str, threads: int, unroll: int, vectorize: bool) -> None:
    """A row reduction's loop ``k`` over the row's threads; with ``vectorize``, the same ``unroll``
    consecutive columns per thread and step as the output stage, as one vector load."""
    if vectorize:
        ko, kt, kv = s.split(k, [None, threads, unroll])
        s.reorder(kt, ko, kv)
        s.vectorize(kv)
    else:
        ko, kt = s.split(k, [None, threads])
        s.reorder(kt, ko)
    s.bind(kt, "threadIdx.x")


def _stage_row(s: Schedule, facts: GeneralReductionFacts, row: str, threads: int, unroll: int,
               vectorize: bool) -> None:
    """One shared copy of the row for every pass, filled by the row's threads ``unroll`` columns at a time."""
    name = facts.row_input
    assert name is not None, "the space's check refuses stage_row without a row input"
    readers = [b for b in s.blocks if name in s.func.block(b).read_buffers]
    copy = s.cache_read(readers[0], name, "shared", consumers=readers[1:])
    s.compute_at(copy, row)
    col = s.get_loops(copy)[-1]
    if unroll > 1:
        outer, lane, run = s.split(col, [None, threads, unroll])
        s.reorder(lane, outer, run)
        (s.vectorize if vectorize else s.unroll)(run)
    else:
        outer, lane = s.split(col, [None, threads])
        s.reorder(lane, outer)
    s.bind(lane, "threadIdx.x")
    if -(-facts.cols // (threads * unroll)) <= MAX_UNROLLED_COPY_STEPS:
        s.unroll(outer)  # every step's global load in flight before the first shared store waits on it


def _registers(threads: int) -> int:
    """Registers per thread, as ptxas allots them on sm_90: 25-40 for 128 threads or more, 30-128 below
    (fewer threads unroll longer loops); a sweep of every point of the space for softmax, RMSNorm and
    LayerNorm over 4096 and 32000 columns."""
    return 32 if threads >= 128 else 64


def _rows_outgrow_l1(facts: GeneralReductionFacts, target: Any, config: Config) -> bool:
    """Whether the rows the SM's resident blocks re-read outgrow the L1 their shared memory leaves, so that
    the later passes would go to L2 (and DRAM), and staging the row is legal.  Measured on an H200
    (2026-11-28): RMSNorm over 4096 x 32000 fp32 (two 128 KB rows per SM) 332 us unstaged, 276 us staged;
    softmax 354 and 351 us; over 4096 columns (four 16 KB rows) staging cost 2-7%."""
    if facts.row_bytes is None or _check(facts, target, config | {"stage_row": True}) is not None:
        return False
    resident = max(1, target.max_threads_per_sm // config["threads"])
    return resident * facts.row_bytes > target.l1_left(resident, 4 * config["threads"])


def _check(facts: GeneralReductionFacts, target: Any, config: Config) -> str | None:
    if not config.get("stage_row"):
        return None
    if facts.row_input is None:
        return "stage_row needs an input that several passes read (none is read more than once per row)"
    if facts.row_bytes is None:
        return "stage_row needs a fixed row length (the shared copy's size); this one is symbolic"
    run = int(config.get("unroll", 1)) * facts.in_bytes
    if run > 16:
        # A thread's elements are read back from shared memory as one access only up to 16 bytes; beyond, a
        # warp's scalar reads fall ``unroll`` words apart, several to a bank (fp32 at unroll 8: 8-way).  On
        # an H200 such staged rows ran 4.2x slower (RMSNorm 4096 x 32000: 1163 against 276 us at unroll 4).
        return (f"stage_row reads each thread's unroll={config.get('unroll')} elements of {facts.in_bytes} bytes "
                f"back as {run}-byte runs, more than one 16-byte access: shared-memory bank conflicts")
    need = facts.row_bytes + 4 * int(config.get("threads", 0))
    limit = target.max_shared_per_block(True)
    if need > limit:
        return f"stage_row needs {need} bytes of shared memory per block, more than the {limit} a block may use"
    return None


def _vector_width(unroll: int, in_bytes: int) -> int:
    """Elements per load when a thread's ``unroll`` consecutive elements make one 4/8/16-byte access."""
    return unroll if unroll > 1 and unroll * in_bytes in (4, 8, 16) else 1
