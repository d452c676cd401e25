"""Property test: random primitive sequences on random small workloads keep the reference result.

Each example draws a built-in workload (odd and symbolic sizes), then a sequence of steps whose primitive
and arguments are drawn from the current state (existing blocks, loops, buffers, plausible factors,
scopes, thread tags).  An accepted step must keep the func's numeric result equal to the unscheduled
func's; a rejected step must raise ScheduleError (nothing else) and leave the schedule untouched.  The
trace of every sequence must replay to an identical func.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import schedlib as sl
from schedlib.ir.func import SCOPES, THREAD_TAGS, Func
from schedlib.ir.reference import evaluate_int

from .helpers import outputs_match, random_inputs, well_formed_problems

SIZES = (1, 3, 7, 33)
MAX_STEPS = 12
MAX_VOLUME = 6000  # iteration points over all blocks; a sequence stops growing its func past this


@dataclass
class Stats:
    sequences: int = 0
    accepted: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    mismatches: int = 0
    foreign: int = 0
    replays: int = 0
    stopped_early: int = 0

    def summary(self) -> dict[str, Any]:
        return {"sequences": self.sequences, "steps_accepted": sum(self.accepted.values()),
                "steps_rejected": sum(self.rejected.values()), "mismatches": self.mismatches,
                "foreign_exceptions": self.foreign, "replays": self.replays,
                "stopped_early": self.stopped_early,
                "accepted_by_primitive": dict(sorted(self.accepted.items())),
                "rejected_by_primitive": dict(sorted(self.rejected.items()))}


# workloads --------------------------------------------------------------------------------------

@dataclass
class Dims:
    """Draws sizes: each an odd constant or a symbolic ``sl.var`` with an odd value bound at run time.

    At most one size per workload is 33, so that every example stays small enough to run in milliseconds.
    """

    data: Any
    symbols: dict[str, int] = field(default_factory=dict)
    values: list[int] = field(default_factory=list)

    def size(self, allow_big: bool = True) -> Any:
        big_used = any(v == 33 for v in self.values)
        choices = SIZES if allow_big and not big_used else SIZES[:3]
        value = self.data.draw(st.sampled_from(choices), label="size")
        self.values.append(value)
        if self.data.draw(st.integers(0, 3), label="symbolic?") == 0:
            name = f"n{len(self.symbols)}"
            self.symbols[name] = value
            return sl.var(name)
        return value


def draw_workload(data: Any) -> tuple[Func, dict[str, int]]:
    dims = Dims(data)
    family = data.draw(st.sampled_from(["matmul", "matmul", "gemv", "reduce", "softmax", "rmsnorm",
                                        "layernorm", "elementwise", "transpose", "side_by_side"]), label="family")
    if family == "matmul":
        dtype = data.draw(st.sampled_from(["float32", "float32", "int8", "float16"]), label="dtype")
        batch = data.draw(st.sampled_from([None, None, 2]), label="batch")
        f = sl.workloads.matmul(dims.size(), dims.size(), dims.size(), dtype=dtype,
                                trans_a=data.draw(st.booleans(), label="trans_a"),
                                trans_b=data.draw(st.booleans(), label="trans_b"), batch=batch,
                                epilogue=data.draw(st.sampled_from(sl.workloads.EPILOGUES), label="epilogue"))
    elif family == "gemv":
        f = sl.workloads.gemv(dims.size(), dims.size(), dtype=data.draw(
            st.sampled_from(["float32", "float16", "int8"]), label="dtype"),
            trans=data.draw(st.booleans(), label="trans"), batch=dims.size(allow_big=False),
            epilogue=data.draw(st.sampled_from([None, "bias", "relu", "bias_relu", "gelu"]), label="epilogue"))
    elif family == "reduce":
        f = sl.workloads.reduce(dims.size(), dims.size(), op=data.draw(
            st.sampled_from(sl.workloads.REDUCE_OPS), label="op"), axis=data.draw(
            st.sampled_from([0, -1]), label="axis"), dtype=data.draw(st.sampled_from(["float32", "int32"]),
                                                                     label="dtype"))
    elif family in ("softmax", "rmsnorm", "layernorm"):
        f = getattr(sl.workloads, family)(dims.size(), dims.size())
    elif family == "elementwise":
        rank = data.draw(st.integers(1, 3), label="rank")
        chain = data.draw(st.lists(st.sampled_from(sl.workloads.ELEMENTWISE_OPS), min_size=1, max_size=3),
                          label="chain")
        dtype = data.draw(st.sampled_from(["float32", "int32"]), label="dtype")
        f = sl.workloads.elementwise(tuple(dims.size() for _ in range(rank)), tuple(chain), dtype=dtype)
    elif family == "transpose":
        f = sl.workloads.transpose(dims.size(), dims.size())
    else:  # blocks that share only their input: a row's sum and max, and the rows scaled
        rows, cols = dims.size(), dims.size()
        X = sl.placeholder((rows, cols), "float32", "X")
        k1, k2 = sl.reduce_axis(cols, "k"), sl.reduce_axis(cols, "k")
        S = sl.compute((rows,), lambda i: sl.sum(X[i, k1], axis=k1), "S")
        M = sl.compute((rows,), lambda i: sl.max(X[i, k2], axis=k2), "M")
        f = sl.func([X, S, M, sl.compute((rows, cols), lambda i, j: X[i, j] * 2.0, "Y")], "side_by_side")
    return f, dims.symbols


# steps ------------------------------------------------------------------------------------------

FACTORS = (None, 1, 2, 3, 4, 8, 16)
PRIMITIVES = ("split", "split", "fuse", "reorder", "reorder", "bind", "vectorize", "unroll", "annotate",
              "storage_align", "cache_read", "cache_read", "cache_write", "compute_at", "compute_at",
              "reverse_compute_at", "reverse_compute_at", "compute_with", "compute_inline", "reverse_compute_inline",
              "rfactor", "decompose_reduction", "decompose_reduction", "get_block", "get_loops")


def _loops(func: Func, blocks: list[str] | None = None) -> list[str]:
    return [lp.name for b in func.blocks if blocks is None or b.name in blocks for lp in b.loops]


def _pick(data: Any, items: list[Any], fallback: Any, label: str) -> Any:
    """One of ``items`` (or ``fallback`` when there is none)."""
    if not items:
        return fallback
    return data.draw(st.sampled_from(items), label=label)


def _prefer(data: Any, good: list[str], every: list[str], label: str) -> str:
    """Mostly one of the ``good`` candidates (those that may be accepted), sometimes any of ``every``."""
    if good and data.draw(st.integers(0, 3), label=f"{label} good?") > 0:
        return data.draw(st.sampled_from(good), label=label)
    return _pick(data, every, "X", label)


def _maybe_bogus(data: Any, value: Any, bogus: Any) -> Any:
    """Mostly ``value``; now and then a name that does not exist, to exercise the rejections."""
    return bogus if data.draw(st.integers(0, 19), label="bogus?") == 19 else value


# A GPU-style schedule skeleton (tile, cache the output, stage the inputs, split the init, bind); the
# arguments of each step are still drawn from the state, so the skeleton reaches deep, varied funcs.
RECIPE = ("split", "split", "split", "reorder", "bind", "cache_write", "reverse_compute_at", "cache_read",
          "compute_at", "cache_read", "compute_at", "decompose_reduction", "fuse", "bind", "bind")


def loop_volume(func: Func, symbols: dict[str, int]) -> int:
    """Iteration points of every block (its enclosing loops included), symbolic extents at their values."""
    return sum(math.prod(evaluate_int(lp.extent, symbols) for lp in func.all_loops(b)) for b in func.blocks)


def _extent(func: Func, loop: str, symbols: dict[str, int]) -> int:
    return evaluate_int(func.loop_owner(loop)[0].loops[func.loop_owner(loop)[1]].extent, symbols) \
        if loop in func.all_loop_names() else 1


def draw_factors(data: Any, extent: int) -> list[int | None]:
    """2 or 3 split factors, at most one None usually; plausible sizes incl. non-divisible and overshooting
    ones, but their product stays within twice the extent (plus a little) to keep the loop nest small."""
    n = data.draw(st.integers(2, 3), label="nfactors")
    factors: list[int | None] = []
    for _ in range(n):
        room = max(2 * extent + 4, 4) // math.prod(f for f in factors if f is not None)
        fitting = [f for f in FACTORS if f is None or f <= room]
        factors.append(data.draw(st.sampled_from(fitting), label="factor"))
    if factors.count(None) > 1 and data.draw(st.booleans(), label="fix nones"):
        first = factors.index(None)
        factors = [f if f is not None or k == first else 1 for k, f in enumerate(factors)]
    return factors


def draw_step(data: Any, func: Func, symbols: dict[str, int], prim: str | None = None
              ) -> tuple[str, dict[str, Any]]:
    """A primitive (drawn unless given) and arguments drawn from the current ``func``."""
    if prim is None:
        prim = data.draw(st.sampled_from(PRIMITIVES), label="primitive")
    blocks = [b.name for b in func.blocks]
    loops = _loops(func)
    any_block = _maybe_bogus(data, _pick(data, blocks, "X", "block"), "nope")
    any_loop = _maybe_bogus(data, _pick(data, loops, "X.i", "loop"), "nope.i")
    if prim == "split":
        return prim, {"loop": any_loop, "factors": draw_factors(data, _extent(func, any_loop, symbols))}
    if prim in ("fuse", "reorder"):
        blk = func.block(_pick(data, blocks, blocks[0], "block"))
        names = [lp.name for lp in blk.loops]
        if prim == "fuse" and len(names) >= 2 and data.draw(st.integers(0, 4), label="adjacent?") > 0:
            start = data.draw(st.integers(0, len(names) - 2), label="start")
            stop = data.draw(st.integers(start + 2, len(names)), label="stop")
            chosen = names[start:stop]
        elif names:
            chosen = data.draw(st.permutations(names), label="perm")[: data.draw(
                st.integers(min(2, len(names)), len(names)), label="count")]
        else:
            chosen = []
        if data.draw(st.integers(0, 9), label="mix blocks?") == 0:
            chosen = [*chosen, _pick(data, loops, "X.i", "loop")]
        return prim, {"loops": list(chosen)}
    if prim == "bind":
        return prim, {"loop": any_loop, "thread": data.draw(st.sampled_from((*THREAD_TAGS, "warp.x")),
                                                             label="thread")}
    if prim in ("vectorize", "unroll"):
        return prim, {"loop": any_loop}
    if prim == "annotate":
        target = any_block if data.draw(st.booleans(), label="block?") else any_loop
        return prim, {"target": target, "key": data.draw(st.sampled_from(["pipeline_stages", "note", "1bad"]),
                                                         label="key"),
                      "value": data.draw(st.sampled_from([2, 1.5, "x", True, None]), label="value")}
    if prim == "storage_align":
        cached = [b.name for b in func.blocks if func.buffer(b.store).scope != "global"
                  and len(func.buffer(b.store).shape) >= 2]
        blk = _prefer(data, cached, blocks, "block")
        rank = len(func.buffer(func.block(blk).store).shape) if func.has_block(blk) else 2
        if data.draw(st.integers(0, 3), label="valid align?") > 0:  # a legal padding, mostly
            factor = data.draw(st.sampled_from([1, 4, 32]), label="factor")
            return prim, {"block": blk, "dim": data.draw(st.integers(0, max(rank - 2, 0)), label="dim"),
                          "factor": factor, "offset": data.draw(st.integers(0, factor - 1), label="offset")}
        return prim, {"block": blk, "dim": data.draw(st.integers(-1, 2), label="dim"),
                      "factor": data.draw(st.sampled_from([0, 4, 32]), label="factor"),
                      "offset": data.draw(st.integers(-1, 33), label="offset")}
    if prim == "cache_read":
        blk = _pick(data, blocks, "X", "block")
        reads = func.block(blk).read_buffers if func.has_block(blk) else []
        buffer: Any = _pick(data, reads, "A", "buffer")
        if data.draw(st.integers(0, 5), label="index?") == 0:
            buffer = data.draw(st.integers(-1, 3), label="buffer index")
        elif data.draw(st.integers(0, 19), label="foreign buffer?") == 0:
            buffer = _pick(data, [b.name for b in func.buffers], "A", "buffer")
        return prim, {"block": _maybe_bogus(data, blk, "nope"), "buffer": buffer,
                      "scope": data.draw(st.sampled_from((*SCOPES, "shared", "local", "texture")), label="scope")}
    if prim == "cache_write":
        return prim, {"block": any_block, "scope": data.draw(st.sampled_from((*SCOPES, "local", "register")),
                                                             label="scope")}
    if prim == "compute_at":
        inner = [b.name for b in func.blocks if b.store not in func.outputs]
        blk = _prefer(data, inner, blocks, "block")
        near: list[str] = []
        if func.has_block(blk):
            readers = [c.name for c in func.consumers(func.block(blk).store)]
            near = _loops(func, readers + [b.name for r in readers for b in func.attached_to(r)])
        loop = _pick(data, near, any_loop, "loop") if data.draw(st.integers(0, 4), label="near?") else any_loop
        return prim, {"block": _maybe_bogus(data, blk, "nope"), "loop": loop}
    if prim == "reverse_compute_at":
        readers = [b.name for b in func.blocks if any(func.producers(r) for r in b.read_buffers)]
        blk = _prefer(data, readers, blocks, "block")
        near = []
        if func.has_block(blk):
            writers = [p.name for r in func.block(blk).read_buffers for p in func.producers(r)]
            near = _loops(func, writers)
        loop = _pick(data, near, any_loop, "loop") if data.draw(st.integers(0, 4), label="near?") else any_loop
        return prim, {"block": _maybe_bogus(data, blk, "nope"), "loop": loop}
    if prim == "compute_with":
        blk = _pick(data, blocks, "X", "block")
        others = [b.name for b in func.blocks if b.name != blk and func.has_block(blk)
                  and func.block(blk).store not in b.read_buffers and b.store not in func.block(blk).read_buffers]
        loop = _pick(data, _loops(func, others), any_loop, "loop") if data.draw(st.integers(0, 4), label="near?") \
            else any_loop
        return prim, {"block": _maybe_bogus(data, blk, "nope"), "loop": loop}
    if prim == "compute_inline":
        inner = [b.name for b in func.blocks if b.reducer is None and b.store not in func.outputs]
        return prim, {"block": _prefer(data, inner, blocks, "block")}
    if prim == "reverse_compute_inline":
        spatial = [b.name for b in func.blocks if b.reducer is None and any(func.producers(r) for r in b.read_buffers)]
        return prim, {"block": _prefer(data, spatial, blocks, "block")}
    if prim in ("get_block", "get_loops"):
        return prim, {"block": any_block}
    if prim == "rfactor":
        r_loops = [lp.name for b in func.blocks for lp in b.loops if b.loop_kind(lp.name) == "R"]
        loop = _pick(data, r_loops, any_loop, "loop") if data.draw(st.integers(0, 4), label="R?") else any_loop
        return prim, {"loop": loop, "factor_axis": data.draw(st.integers(-1, 3), label="factor_axis")}
    # decompose_reduction
    reductions = [b.name for b in func.blocks if b.reducer is not None]
    blk = _pick(data, reductions, any_block, "block") if data.draw(st.integers(0, 4), label="R?") else any_block
    own = _loops(func, [blk])
    loop = _pick(data, own, any_loop, "loop") if data.draw(st.integers(0, 4), label="own?") else any_loop
    return prim, {"block": blk, "loop": loop}


def apply_step(s: sl.Schedule, prim: str, args: dict[str, Any]) -> Any:
    """Call the public Schedule method for one drawn step."""
    if prim in ("fuse", "reorder"):
        return getattr(s, prim)(*args["loops"])
    if prim in ("get_block", "get_loops"):
        return getattr(s, prim)(args["block"])
    return getattr(s, prim)(**args)


# the test ---------------------------------------------------------------------------------------

def run_sequence(data: Any, stats: Stats) -> None:
    func, symbols = draw_workload(data)
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    inputs = random_inputs(func, np.random.default_rng(seed), symbols)
    expected = sl.run_reference(func, inputs)
    s = sl.Schedule(func)
    plan: list[str | None] = [None] * data.draw(st.integers(1, MAX_STEPS), label="steps")
    if data.draw(st.integers(0, 2), label="recipe?") == 0:
        plan = [*RECIPE, *plan[: len(plan) // 2]]
    log: list[str] = []
    for forced in plan:
        if loop_volume(s.func, symbols) > MAX_VOLUME:
            stats.stopped_early += 1
            break
        prim, args = draw_step(data, s.func, symbols, forced)
        before, trace_len, text = s.func, len(s.trace), str(s.func)
        try:
            apply_step(s, prim, args)
        except sl.ScheduleError as err:
            stats.rejected[prim] += 1
            log.append(f"rejected {prim}({args}): {err}")
            assert s.func is before and len(s.trace) == trace_len and str(s.func) == text, \
                f"{prim}({args}) raised but changed the schedule"
            continue
        except Exception as exc:
            stats.foreign += 1
            raise AssertionError(f"{prim}({args}) raised {type(exc).__name__}: {exc}\n" + "\n".join(log)
                                 + f"\n{text}") from exc
        stats.accepted[prim] += 1
        log.append(f"{prim}({args})")
        problems = well_formed_problems(s.func)
        assert not problems, f"{prim}({args}) left a malformed func: {problems}\n" + "\n".join(log) + f"\n{s.func}"
        str(s.func)  # the printer handles every func a primitive returns
    try:
        got = sl.run_reference(s, inputs)
    except Exception as exc:
        stats.foreign += 1
        raise AssertionError(f"reference run failed ({type(exc).__name__}: {exc}) after\n" + "\n".join(log)
                             + f"\n{s.func}") from exc
    problem = outputs_match(func, expected, got)
    if problem is not None:
        stats.mismatches += 1
        raise AssertionError(f"result differs ({problem}) after\n" + "\n".join(log) + f"\n{s.func}")
    replay = sl.Schedule.from_trace(func, s.trace.to_json())
    assert replay.func == s.func, "trace replay gives a different func"
    assert replay.trace.digest() == s.trace.digest()
    stats.replays += 1
    stats.sequences += 1


def _run_property(examples: int, name: str, stream: int, tmp_path_factory: Any, record_property: Any
                  ) -> dict[str, Any]:
    """Run ``examples`` sequences from the fixed random stream ``stream``; record and check the counts."""
    stats = Stats()

    @seed(stream)
    @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def check(data: Any) -> None:
        run_sequence(data, stats)

    start = time.perf_counter()
    check()
    summary = stats.summary() | {"seconds": round(time.perf_counter() - start, 1)}
    path = tmp_path_factory.getbasetemp() / f"{name}.json"
    path.write_text(json.dumps(summary, indent=1))
    record_property("property_stats", json.dumps(summary))
    print(f"\n{name}: {json.dumps(summary)}\n(written to {path})")
    assert stats.mismatches == 0 and stats.foreign == 0
    assert stats.sequences >= examples and stats.replays == stats.sequences
    # the draws reach deep states: most primitives were both accepted and rejected along the way
    assert len(stats.accepted) >= 15 and len(stats.rejected) >= 15, summary
    assert sum(stats.accepted.values()) >= 4 * examples
    return summary


EXAMPLES_PER_HALF = 400  # two tests, so pytest-xdist runs the halves in parallel: 800 sequences


def test_random_schedules_first_half(tmp_path_factory: Any, record_property: Any) -> None:
    _run_property(EXAMPLES_PER_HALF, "property_first_half", 20240601, tmp_path_factory, record_property)


def test_random_schedules_second_half(tmp_path_factory: Any, record_property: Any) -> None:
    _run_property(EXAMPLES_PER_HALF, "property_second_half", 7, tmp_path_factory, record_property)
