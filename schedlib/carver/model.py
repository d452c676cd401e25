"""The analytical cost model: one tiling of one problem on one GPU profile -> figures and an estimated time.

Why this shape of model.  A roofline alone (time = max(work / peak) over compute, DRAM, L2 and shared
memory) ranks tiles by data reuse, which is Roller's insight, but it is blind to the two things that
separate neighbouring tiles in practice: how many blocks an SM can hold (occupancy, hence latency
hiding) and how the last wave of blocks fills the machine.  So the time is built per SM, one *round*
of co-resident blocks at a time:

    round(n blocks, at most k on one SM) = max(
        k * compute per block / SM peak,               # issue throughput
        n * DRAM bytes per block / DRAM bw,            # DRAM serves every block of the round
        n * L2 bytes per block / L2 bw,                # ... and so does L2
        k * shared+L1 bytes per block / SM port bw,    # the SM's own load/store port
        one block's dependent latency chain            # memory round trips + dependent FMAs
          + k * block start)                           # the SM starts its blocks one after another

    time = full_waves * round(blocks_per_sm x SMs, blocks_per_sm) + round(tail blocks, ceil(tail / SMs))

The last term is the wave effect: a partial last wave costs a whole round but its blocks run with fewer
neighbours.  The latency term makes low occupancy and shallow pipelines visible: a block that loads a
tile, waits ~500 ns, computes, and loads again cannot be faster than its chain of round trips, and only
other resident blocks fill that time.

Memory: L2 bytes are every block's tile footprints in 32-byte sectors.  DRAM bytes are the compulsory
bytes (each input read once, each output written once) plus the re-reads of data several blocks read,
in proportion to how far the working set that would keep them exceeds the usable L2: one wave's whole
footprint for data an earlier wave read (a tiling's ``raster`` reshapes that wave: see
:func:`~schedlib.carver.traffic.distinct_per_wave`), only its in-flight k slices for data another block
of the same wave reads (see :func:`~schedlib.carver.memory.traffic_sums`).  Shared/L1 bytes
count one 4-byte bank slot per element a thread loads into registers, plus the staging copies; mma
operands instead move as ldmatrix rows, each warp reading its warp tile once per k.

A row kernel that reads its input again in later passes (``Tiling.rereads``: a softmax's max, sum and
output passes) pays for each pass at the level that keeps the rows in flight: shared memory when the
rule stages them there, L1 when they fit beside the blocks' shared memory, else L2, spilling to DRAM
past the usable L2.

Compute: arithmetic runs at the FP32 lane rate (the main block at the tensor-core peak when the tiling
says so) and every instruction, loads included, takes an issue slot; threads with no point left still
issue their step; a cross-thread reduction adds log2(threads combining) serial shuffle levels.

Assumptions stated once: intermediate buffers stay on chip (rules fuse), blocks launch with the last
spatial axis fastest, shared-memory bank conflicts are not modelled.  Constants the profile lacks
(latencies, the usable L2 share) are below with their sources; they move absolute times more than
the order of configs.
"""

from __future__ import annotations

import math
from typing import Any

from schedlib.carver.align import alignment_issue
from schedlib.carver.memory import L2_USABLE_FRACTION, l2_overflow, later_passes, staged_loads, traffic_sums
from schedlib.carver.occupancy import SUB_PARTITIONS, occupancy
from schedlib.carver.partials import split_cost
from schedlib.carver.problem import Problem
from schedlib.carver.traffic import geometry
from schedlib.errors import ProfileError
from schedlib.hw import HardwareProfile
from schedlib.rules.base import Tiling

# Load-to-use latencies, typical of A100/H100 microbenchmarks (Jia et al., "Dissecting the NVIDIA
# Volta/Ampere GPU architecture via microbenchmarking"; Chips and Cheese H100 measurements): DRAM
# about 450-600 ns, L2 hits about 150-250 ns.
DRAM_LATENCY_S = 500e-9
L2_LATENCY_S = 200e-9
# An SM takes its blocks one after another: each costs about this long to start and retire.  Fitted to one
# measurement (H200, 2026-11-28): a 4096 x 4096 row sum in 65,536 blocks of 64 threads ran 48.8 us against
# 24.3 us in 4,096 blocks of 256, where the model without it put both at the same DRAM time.
BLOCK_LAUNCH_S = 60e-9
# Cycles before a dependent FP32 FMA can issue (Volta and later).
FMA_LATENCY_CYCLES = 4
# A cross-thread reduction: one shuffle-and-combine level (log2 of the threads combining) and, when it
# spans warps, a round through shared memory with a barrier (Volta-Hopper microbenchmarks).
COMBINE_LEVEL_CYCLES = 30
BARRIER_CYCLES = 100
# Accesses carrying less than this share of the L2 traffic are not held to the sector-alignment rule.
MINOR_TRAFFIC = 0.05
# Integer multiply-add issues at half the FP32 FMA rate on Ampere and Hopper.
INT_RATE = 0.5

LEVEL_NAMES = {"compute": "compute", "dram": "DRAM", "l2": "L2", "shared": "shared/L1", "latency": "latency"}


# On a GPU with warpgroup MMA (Hopper) the listed tensor-core peak is wgmma's; warp-level mma.sync is reported
# to top out near half of it.  A model assumption taken from public reports, not measured by this project.
MMA_SYNC_SHARE_ON_WGMMA_GPUS = 0.5


def _peaks(problem: Problem, profile: HardwareProfile, tensor_core: bool, warpgroup: bool = False
           ) -> tuple[float, float | None, str]:
    """(SIMT instruction-peak in FLOP/s, tensor-core peak or None, unit label).

    SIMT work is timed at the FP32 FMA rate whatever the storage dtype: generated code computes in
    scalar float (fp16 operands are converted), so the packed half2 peak is out of reach.
    """
    simt = profile.peak_flops("float32", False)
    if problem.acc_dtype.startswith("int"):
        simt *= INT_RATE
    label = "SIMT fp32" if not problem.acc_dtype.startswith("int") else "SIMT int32"
    if not tensor_core:
        return simt, None, label
    try:
        tc = profile.peak_flops(problem.in_dtype, True)
    except ProfileError:
        return simt, None, f"{label} (no {problem.in_dtype} tensor cores on {profile.key})"
    if not warpgroup and "wgmma" in profile.tensor_core_shapes:
        return simt, tc * MMA_SYNC_SHARE_ON_WGMMA_GPUS, f"tensor core {problem.in_dtype} (mma.sync)"
    return simt, tc, f"tensor core {problem.in_dtype}"


def _best_peak(problem: Problem, profile: HardwareProfile, simt: float) -> float:
    """The fastest rate the card offers for the problem's dtype: its tensor cores at their full (wgmma) rate
    where it has them for a 16-bit or int8 input, else the SIMT rate.  fp32 stays on SIMT: the library
    computes it exactly, as cuBLAS SGEMM does without TF32."""
    if problem.in_dtype in ("float16", "bfloat16", "int8"):
        try:
            return max(simt, profile.peak_flops(problem.in_dtype, True))
        except ProfileError:
            return simt
    return simt


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def evaluate(problem: Problem, tiling: Tiling, profile: HardwareProfile, *, explain: bool = True,
             memo: dict | None = None) -> dict[str, Any]:
    """Every figure of the model for one tiling (see the module docstring); times in microseconds.

    ``explain=False`` leaves out the ``reason`` sentence (the ranking adds it to the rows it keeps);
    ``memo`` is a dict the caller keeps per (problem, profile) to share traffic between configs.
    """
    geo = geometry(problem, tiling)
    occ = occupancy(profile, tiling.threads, tiling.registers, tiling.shared_bytes)
    sm = profile.sm_count
    bps = occ.blocks_per_sm
    grid = geo.grid
    threads = tiling.threads
    sector = profile.transaction_bytes.global_sector

    # ---- traffic -------------------------------------------------------------------------------
    # Traffic depends only on the tile shape and the blocks resident per wave; configs differing in
    # thread tiles or vector width share it, so the ranking memoises it.
    resident = max(1, min(grid, max(bps, 1) * sm))
    raster = max(1, int(tiling.raster))
    memo_key = (tuple(geo.padded.values()), tuple(geo.step.values()), resident, raster)
    cached = memo.get(memo_key) if memo is not None else None
    if cached is None:
        cached = traffic_sums(problem, geo, resident, sector, raster)
        if memo is not None:
            memo[memo_key] = cached
    loads, stores, l2_bytes, wave_set, inflight_set, block_global, useful_bytes, same_wave, later_wave = cached
    compulsory = float(problem.compulsory_bytes)
    usable_l2 = L2_USABLE_FRACTION * profile.l2_bytes
    inflight_misses = l2_overflow(inflight_set, usable_l2)
    rereads_from_dram = later_wave * l2_overflow(wave_set, usable_l2) + same_wave * inflight_misses
    dram_bytes = max(compulsory, min(l2_bytes, compulsory + rereads_from_dram))
    staged = staged_loads(problem, tiling, geo)
    pass_l2, pass_dram, pass_port, pass_instr = later_passes(problem, tiling, geo, loads, staged, bps, profile)
    l2_bytes += pass_l2
    dram_bytes += pass_dram

    # ---- shared memory / L1 port -----------------------------------------------------------------
    thread_tile = {a: max(1, int(v)) for a, v in tiling.thread_tile.items() if a in geo.padded}
    spatial_threads = math.prod(-(-geo.padded[a] // v) for a, v in thread_tile.items())
    reduce_threads = max(1.0, threads / max(1, spatial_threads))
    reduce_per_thread = math.prod(geo.padded[r] for r in problem.reduce) / reduce_threads
    port_block = pass_port + sum(t.block_bytes for t in stores)
    mem_instr_block = pass_instr + sum(t.block_bytes / t.access.nbytes for t in stores)  # one store per element
    vector = max(1, int(tiling.vector))
    warp_tile = tiling.warp_tile
    for (acc, spatial, has_reduce), t in zip(problem.load_shape, loads):
        if tiling.tensor_core and warp_tile and has_reduce and acc.buffer in staged:
            # mma operands: each warp reads its warp tile's rows per k with ldmatrix (16 bytes per lane and
            # instruction, no 4-byte slot per element), and the tile arrives by 16-byte cp.async.  wgmma reads
            # them once per warpgroup of 4 warps (the Tiling's warp_tile is then the warpgroup's tile).
            # Fed by the TMA, the copy costs one thread a few instructions per tile instead of every thread one
            # per 16 bytes.
            warps = threads / profile.warp_size / (4 if tiling.warpgroup else 1)
            frag_bytes = warps * math.prod(warp_tile.get(a, 1) for a in spatial) * acc.nbytes * reduce_per_thread
            port_block += frag_bytes + t.block_bytes
            mem_instr_block += (frag_bytes + (0 if tiling.tma else t.block_bytes)) / 16
            continue
        frag = math.prod(thread_tile.get(a, 1) for a in spatial)
        # register loads, one per element; at least the block's footprint (a Tiling without a thread
        # tile for an axis still has its threads read every element of it)
        reads = max(threads * frag * (reduce_per_thread if has_reduce else 1.0), t.block_bytes / t.factor / acc.nbytes)
        port_block += reads * max(acc.nbytes, 4)
        if acc.buffer in staged:  # register loads from shared, plus the cooperative copy into it
            port_block += t.block_bytes
            mem_instr_block += reads + 2 * t.block_bytes / acc.nbytes / vector
        else:  # straight from global memory into registers, ``vector`` elements per load
            mem_instr_block += reads / vector

    # ---- compute ---------------------------------------------------------------------------------
    simt_peak, tc_peak, unit = _peaks(problem, profile, tiling.tensor_core, tiling.warpgroup)
    simt_instr_block = tc_flops_block = useful_simt = useful_tc = 0.0
    combine_cycles = 0.0  # one block's cross-thread reductions, serial
    passes = 0  # loop steps over global inputs one block waits on, one after the other
    # With its re-read inputs staged in shared memory, a row kernel waits on global memory in its first
    # pass only (the copy); the later passes read shared memory.
    staged_rows = bool(tiling.rereads) and all(b in staged for b in tiling.rereads)
    waited = False
    for w in problem.work:
        launched = math.prod(geo.padded[t.axis] if t.axis else t.extent for t in w.terms)
        # every thread runs its share of the points; a thread with nothing to do still issues its step
        issued = threads * -(-launched // threads)
        if w.main and tc_peak is not None:
            tc_flops_block += w.flops * launched
            useful_tc += w.flops * problem.points(w)
        else:
            simt_instr_block += w.instructions * issued
            useful_simt += w.instructions * problem.points(w)
        if w.reduces:
            outputs = math.prod(geo.padded[t.axis] if t.axis else t.extent
                                for t, kind in zip(w.terms, w.kinds) if kind == "S")
            coop = threads / max(1, outputs)  # threads combining partial results of one output
            if coop > 1:
                levels = math.log2(coop)
                combine_cycles += levels * COMBINE_LEVEL_CYCLES + (BARRIER_CYCLES if coop > profile.warp_size else 0)
                mem_instr_block += 2 * levels * threads
        if w.reads_input and not (staged_rows and waited):
            waited = True
            passes += math.prod(-(-geo.tile[t.axis] // geo.step[t.axis]) for t in w.terms if t.axis)
    # SIMT arithmetic runs at the FP32 lane rate, and every instruction (loads and stores too) takes an
    # issue slot: 4 schedulers x 32 threads per clock per SM.  On GPUs with as many FP32 lanes as issue
    # slots (Hopper), register-tile loads steal FMA throughput; on A100 they fit beside it.
    issue_rate = SUB_PARTITIONS * profile.warp_size * profile.clock_hz  # thread-instructions/s per SM
    comp_block = max(2 * simt_instr_block / (simt_peak / sm), (simt_instr_block + mem_instr_block) / issue_rate)
    comp_block += tc_flops_block / (tc_peak / sm) if tc_peak else 0.0

    # ---- one block's latency chain -----------------------------------------------------------------
    # Each loop step over global inputs (a reduction's pipeline step, a row pass of a row kernel, the
    # epilogue's loads) is one round trip the block waits for; a stages-deep pipeline overlaps them with
    # arithmetic and keeps stages - 1 of them in flight (Little's law: the chain shortens by that factor),
    # or fewer where slots stay held by asynchronous work still reading them (the Tiling's ``ahead``).
    # Dependent FMAs wait FMA_LATENCY_CYCLES unless the thread tile gives independent ones.
    stages = max(1, int(tiling.stages))
    round_trips = passes
    # A trip's latency is L2's or DRAM's by the share of its bytes that come from DRAM, but a block that
    # reads what another block of its wave fetches at the same moment waits for the same DRAM fill: those
    # re-reads are L2 traffic without L2 latency (counting them made a bigger problem look faster).
    waited_bytes = l2_bytes - same_wave * (1.0 - inflight_misses)
    hit = 1.0 - min(1.0, dram_bytes / waited_bytes) if waited_bytes > 0 else 0.0
    avg_latency = hit * L2_LATENCY_S + (1 - hit) * DRAM_LATENCY_S
    lat_mem = round_trips * avg_latency
    ilp = min(FMA_LATENCY_CYCLES, max(1, math.prod(thread_tile.values())))
    lat_comp = ((simt_instr_block / threads) * FMA_LATENCY_CYCLES / ilp + combine_cycles) / profile.clock_hz
    ahead = stages - 1 if tiling.ahead is None else max(0, int(tiling.ahead))
    floor = lat_mem + lat_comp if ahead == 0 else max(lat_mem / ahead, lat_comp)

    # ---- rounds (the wave model) -------------------------------------------------------------------
    dram_bw, l2_bw, shared_bw = profile.dram_bytes_per_s, profile.l2_bytes_per_s, profile.shared_bytes_per_s
    per_block = {"compute": comp_block, "dram": dram_bytes / grid / dram_bw, "l2": l2_bytes / grid / l2_bw,
                 "shared": port_block / (shared_bw / sm)}
    if bps > 0:
        slots = bps * sm
        full, rest = divmod(grid, slots)
        # (rounds, blocks on the busiest SM, blocks in the round): an SM's compute and port serve its own
        # blocks one after another, while DRAM and L2 serve every block of the round, and a tail round has
        # only ``rest`` of them (ceil(rest / sm) on its busiest SMs, fewer on the others).
        rounds = [(full, bps, slots)] if full else []
        if rest:
            rounds.append((1, -(-rest // sm), rest))
        totals = dict.fromkeys(LEVEL_NAMES, 0.0)
        time = 0.0
        for count, k, blocks in rounds:
            terms = {"compute": k * per_block["compute"], "dram": blocks * per_block["dram"],
                     "l2": blocks * per_block["l2"], "shared": k * per_block["shared"],
                     "latency": floor + k * BLOCK_LAUNCH_S}
            time += count * max(terms.values())
            for name, v in terms.items():
                totals[name] += count * v
        bound = max(totals, key=totals.__getitem__)
        waves = grid / slots
        wave_eff = waves / math.ceil(waves)
        split_s, split_bytes = split_cost(problem, int(tiling.split_k), profile)
        time += split_s
        dram_bytes += split_bytes
        l2_bytes += split_bytes
    else:
        # cannot launch: no time at all (NaN, not inf, so feature matrices built from figures stay valid)
        time, bound, waves, wave_eff = math.nan, "launch", math.nan, 0.0

    # ---- roofline at full machine rates ---------------------------------------------------------------
    roof = {
        "compute": 2 * useful_simt / simt_peak + (useful_tc / tc_peak if tc_peak else 0.0),
        "dram": dram_bytes / dram_bw,
        "l2": l2_bytes / l2_bw,
        "shared": port_block * grid / shared_bw,
    }
    roof_level = max(roof, key=roof.__getitem__)
    # % of peak: the problem's own floor on this card - its useful work at the fastest unit the card has for
    # its dtype, or its compulsory bytes at DRAM bandwidth - over the estimate.  One scale for every config of
    # a problem (a SIMT fp16 point is not "78%" of the SIMT peak when the tensor cores could do the work).
    ideal = max(problem.useful_flops / _best_peak(problem, profile, simt_peak), compulsory / dram_bw)
    pct = 100.0 * ideal / time if time > 0 else 0.0  # False for NaN
    minor = [t.access for t in (*loads, *stores) if t.total_bytes < MINOR_TRAFFIC * l2_bytes]
    issue = alignment_issue(problem, geo, tiling, profile, minor)
    flops = problem.useful_flops

    figures: dict[str, Any] = {
        "main_block": problem.main,
        "symbolic": problem.symbolic_label(),
        "block_tile": dict(geo.padded),
        "thread_tile": thread_tile,
        "grid_blocks": grid,
        "threads_per_block": threads,
        "warps_per_block": occ.warps_per_block,
        "registers_per_thread": tiling.registers,
        "reg_bytes_per_block": threads * tiling.registers * 4,
        "smem_bytes_per_block": tiling.shared_bytes,
        "global_bytes_per_block": block_global,
        "wave_working_set_bytes": wave_set,
        "dram_bytes": dram_bytes,
        "l2_bytes": l2_bytes,
        "shared_bytes": port_block * grid,
        "compulsory_bytes": compulsory,
        "transactions": l2_bytes / sector,
        "sector_efficiency": useful_bytes / l2_bytes if l2_bytes else 1.0,
        "staged_in_shared": ",".join(sorted(staged)),
        "blocks_per_sm": bps,
        "occupancy": occ.occupancy,
        "occupancy_limiter": occ.limiter,
        "limit_warps": occ.by_warps,
        "limit_registers": occ.by_registers,
        "limit_shared": occ.by_shared,
        "limit_blocks": occ.by_blocks,
        "smem_alloc_per_block": occ.shared_per_block,
        "regs_alloc_per_warp": occ.registers_per_warp,
        "waves": waves,
        "wave_efficiency": wave_eff,
        "flops": flops,
        "arithmetic_intensity": flops / dram_bytes if dram_bytes else 0.0,
        "compute_unit": unit,
        "peak_flops": tc_peak or simt_peak,
        "t_compute_us": roof["compute"] * 1e6,
        "t_dram_us": roof["dram"] * 1e6,
        "t_l2_us": roof["l2"] * 1e6,
        "t_shared_us": roof["shared"] * 1e6,
        "t_latency_us": floor * 1e6,
        "instructions": (simt_instr_block + mem_instr_block) * grid,
        "round_trips_per_block": round_trips,
        "pipeline_stages": stages,
        "avg_latency_ns": avg_latency * 1e9,
        "roofline_bound": roof_level,
        "bound": bound,
        "est_time_us": time * 1e6,
        "pct_of_peak": pct,
        "aligned": issue is None,
        "alignment": issue or "",
    }
    if explain:
        figures["reason"] = reason(figures, profile)
    return figures


def reason(f: dict[str, Any], profile: HardwareProfile) -> str:
    """One sentence: what bounds the time, with the amount and the rate, then the wave and occupancy."""
    if f["blocks_per_sm"] == 0:
        return (f"cannot launch: {f['threads_per_block']} threads x {f['registers_per_thread']} registers and "
                f"{f['smem_bytes_per_block']} B shared memory do not fit one SM ({f['occupancy_limiter']})")
    bw = profile.bandwidth_gbs
    amounts = {
        "compute": f"{f['flops'] / 1e9:.3g} GFLOP at {f['peak_flops'] / 1e12:.4g} TFLOPS ({f['compute_unit']})",
        "dram": f"{_fmt_bytes(f['dram_bytes'])} at {bw.dram:g} GB/s",
        "l2": f"{_fmt_bytes(f['l2_bytes'])} at {bw.l2:g} GB/s",
        "shared": f"{_fmt_bytes(f['shared_bytes'])} at {bw.shared:g} GB/s",
    }
    waves = f"{f['waves']:.2f} waves ({f['wave_efficiency']:.0%} wave efficiency)"
    occ = f"{f['blocks_per_sm']} blocks/SM ({f['occupancy_limiter']}-limited)"
    if f["bound"] == "latency":
        roof = f["roofline_bound"]
        return (f"latency-bound: {f['round_trips_per_block']:.0f} dependent memory round trips of "
                f"~{f['avg_latency_ns']:.0f} ns per block with {occ}; roofline is {LEVEL_NAMES[roof]} "
                f"({amounts[roof]}); {waves}")
    return f"{LEVEL_NAMES[f['bound']]}-bound: {amounts[f['bound']]}; {waves}; {occ}"


__all__ = ["DRAM_LATENCY_S", "FMA_LATENCY_CYCLES", "L2_LATENCY_S", "L2_USABLE_FRACTION", "SUB_PARTITIONS",
           "evaluate", "reason"]
