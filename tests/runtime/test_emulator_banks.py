"""The bank census (schedlib.runtime.emulator.banks): warp requests rebuilt from the emulator's shared-memory
log and costed in wavefronts, on hand-written patterns whose cost is known, then on generated kernels."""

from __future__ import annotations

import numpy as np
import pytest
from emu_kernels import full, needs_gxx

import schedlib as sl
from schedlib.errors import EmulatorError
from schedlib.rules import get_rule
from schedlib.runtime.emulator import KernelLaunch
from schedlib.runtime.emulator.banks import BankSite, bank_census

pytestmark = [needs_gxx, pytest.mark.emulator]

# Each line reads one pattern; `mode` picks the pattern of the strided line at run time.
PATTERNS = r"""
extern "C" __global__ void patterns(SL_GLOBAL(float) out, int stride) {
  SL_SHARED(float, tile, 2048);
  SL_SHARED(double, wide, 64);
  const int t = threadIdx.x;
  for (int i = t; i < 2048; i += blockDim.x) tile[i] = 1.0f;  // PATTERN unit-stride store
  if (t < 64) wide[t] = 2.0;
  __syncthreads();
  float a = tile[(t * stride) % 2048];                         // PATTERN strided
  a += tile[5];                                                // PATTERN broadcast
  if (t % 2 == 0) a += tile[(t * 32) % 1024];                  // PATTERN even lanes, stride 32
  float4 v = SL_VLOAD(float4, tile, (t % 32) * 4);             // PATTERN float4 contiguous
  float4 w = SL_VLOAD(float4, tile, (t % 32) * 8);             // PATTERN float4 every other
  a += static_cast<float>(wide[t % 32]);                       // PATTERN double contiguous
  out[t] = a + v.x + w.y;
}
"""


def run(stride: int, blocks: int = 1, grid: int = 1) -> dict[str, BankSite]:
    out = np.zeros(64 * grid, np.float32)
    sites = bank_census(full(PATTERNS), [KernelLaunch("patterns", (grid, 1, 1), (64, 1, 1), ("out", "stride"))],
                        {"out": out, "stride": stride}, blocks=blocks)
    by_name = {}
    for site in sites:
        if "PATTERN" in site.code:
            by_name[site.code.split("PATTERN ")[1]] = site
    return by_name


@pytest.mark.parametrize(("stride", "ways"), [(1, 1), (2, 2), (4, 4), (32, 32), (33, 1)])
def test_strided_words_conflict_by_the_stride_s_common_factor_with_32_banks(stride: int, ways: int) -> None:
    site = run(stride)["strided"]
    assert (site.requests, site.ideal, site.wavefronts) == (2, 2, 2 * ways)  # 64 threads: 2 warps
    assert site.conflict == ways
    assert (site.op, site.bytes, site.buffer) == ("load/store", 4, "tile")


def test_known_patterns_cost_what_the_hardware_charges() -> None:
    sites = run(1)
    cost = {name: (s.requests, s.wavefronts, s.ideal) for name, s in sites.items()}
    assert cost["unit-stride store"] == (2 * 32, 2 * 32, 2 * 32)  # 32 iterations per warp
    assert cost["broadcast"] == (2, 2, 2)  # one word for every lane
    assert cost["even lanes, stride 32"] == (2, 2 * 16, 2)  # 16 active lanes, all in bank 0
    assert cost["float4 contiguous"] == (2, 2 * 4, 2 * 4)  # 4 phases of 8 lanes x 16 bytes
    assert cost["float4 every other"] == (2, 2 * 8, 2 * 4)  # lanes 4 apart collide: two-way
    assert cost["double contiguous"] == (2, 2 * 2, 2 * 2)  # 2 phases of 16 lanes x 8 bytes
    assert sites["float4 contiguous"].op == "vector load" and sites["float4 contiguous"].bytes == 16
    assert sites["double contiguous"].bytes == 8 and sites["double contiguous"].buffer == "wide"


def test_each_site_is_named_by_its_source_line() -> None:
    src = full(PATTERNS).splitlines()
    sites = run(1)
    assert len(sites) == 7
    for site in sites.values():
        assert site.line is not None and src[site.line - 1].strip() == site.code


def test_only_the_sampled_blocks_run() -> None:
    one, three = run(1, blocks=1, grid=4), run(1, blocks=3, grid=4)
    assert three["strided"].requests == 3 * one["strided"].requests == 6
    every = run(1, blocks=10, grid=4)  # more than the grid has: all four
    assert every["strided"].requests == 8


@pytest.mark.parametrize("blocks", [0, -1, 1.5, True])
def test_a_bad_block_count_is_refused(blocks: object) -> None:
    with pytest.raises(EmulatorError, match="blocks must be an int >= 1"):
        bank_census(full(PATTERNS), [KernelLaunch("patterns", (1, 1, 1), (64, 1, 1), ("out", "stride"))],
                    {"out": np.zeros(64, np.float32), "stride": 1}, blocks=blocks)  # type: ignore[arg-type]


LDMATRIX = r"""
extern "C" __global__ void rows(SL_GLOBAL(unsigned) out, int swizzle) {
  SL_SHARED(half, tile, 8 * 64);  // 8 rows of 128 bytes
  const int lane = threadIdx.x;
  for (int i = lane; i < 8 * 64; i += 32) tile[i] = __float2half(1.0f);
  __syncthreads();
  const int row = lane % 8, chunk = lane / 8;  // matrix i: 16-byte chunk i of each of the 8 rows
  const int phys = swizzle ? (chunk ^ row) : chunk;
  unsigned r[4];
  sl_ldmatrix_x4(r, &tile[row * 64 + phys * 8]);
  out[lane] = r[0] + r[1] + r[2] + r[3];
}
"""


@pytest.mark.parametrize(("swizzle", "ways"), [(0, 8), (1, 1)])
def test_ldmatrix_rows_of_one_bank_group_conflict_and_the_xor_swizzle_spreads_them(swizzle: int, ways: int) -> None:
    sites = bank_census(full(LDMATRIX), [KernelLaunch("rows", (1, 1, 1), (32, 1, 1), ("out", "swizzle"))],
                        {"out": np.zeros(32, np.uint32), "swizzle": swizzle})
    (ld,) = [s for s in sites if s.op.startswith("ldmatrix")]
    assert (ld.op, ld.buffer, ld.bytes, ld.requests, ld.ideal) == ("ldmatrix.x4", "tile", 16, 1, 4)
    assert ld.wavefronts == 4 * ways
    # the address handed to ldmatrix is not a load of its own
    assert not [s for s in sites if "sl_ldmatrix" in s.code and s.op == "load/store"]


def _inputs(func: sl.Func, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(tuple(int(d.value) for d in func.buffer(n).shape)).astype(np.float16)
            for n in func.inputs]


def test_mma_sync_matmul_reads_and_fills_its_swizzled_tiles_without_conflicts(rng: np.random.Generator) -> None:
    f = sl.workloads.matmul(128, 128, 64, "float16")
    config = {"block_m": 64, "block_n": 64, "block_k": 32, "thread_m": 4, "thread_n": 8, "vector": 1,
              "split_k": 1, "stages": 2, "tensor_core": True, "raster": 1}
    df = sl.build(get_rule("matmul").apply(f, "a100", config), "a100").bank_conflicts(*_inputs(f, rng), blocks=2)
    assert set(df["op"]) == {"ldmatrix.x4", "ldmatrix.x4.trans", "cp.async store"}
    assert (df["conflict"] == 1.0).all(), df.to_string()
    assert list(df.columns) == ["kernel", "line", "buffer", "op", "bytes", "requests", "wavefronts", "ideal",
                                "conflict", "code"]


def test_wgmma_matmul_stages_its_output_without_conflicts_and_mbarriers_are_not_loads(
        rng: np.random.Generator) -> None:
    f = sl.workloads.matmul(128, 128, 64, "float16")
    kernel = sl.build(sl.rules.apply_default(f, "h100"), "h100")
    assert "sl_mbar_wait" in kernel.source
    df = kernel.bank_conflicts(*_inputs(f, rng), blocks=1)
    assert set(df["buffer"]) == {"sl_out_s"}, df.to_string()
    assert (df["conflict"] == 1.0).all(), df.to_string()


@pytest.mark.parametrize(("pad", "worst"), [(0, 32.0), (1, 1.0)])
def test_the_transpose_rule_s_padding_is_what_keeps_its_column_reads_conflict_free(pad: int, worst: float) -> None:
    f = sl.workloads.transpose(64, 64)
    rule = get_rule("transpose")
    config = {**rule.default_config(f, "h100"), "pad": pad}
    df = sl.build(rule.apply(f, "h100", config), "h100").bank_conflicts(np.ones((64, 64), np.float32), blocks=2)
    assert list(df["conflict"]) == sorted(df["conflict"], reverse=True)  # worst first
    assert df["conflict"].iloc[0] == worst and df["conflict"].iloc[-1] == 1.0  # the row-wise fill never conflicts
    assert set(df["buffer"]) == {"X_shared"}


def test_the_simt_matmul_interleaves_b_so_its_16_byte_reads_are_conflict_free(rng: np.random.Generator) -> None:
    """The fp32 default for 4096^3 (8x8 per thread) on a 256^3 problem: each thread reads its 8 B columns as two
    16-byte loads.  With B_shared as copied, lanes 4 apart in a quarter warp hit the same banks (2.0); the
    rule's storage_permute makes each load one 128-byte row (1.0), and its copy fills the permuted rows in
    storage order (1.0 as well)."""
    rule = get_rule("matmul")
    config = rule.default_config(sl.workloads.matmul(4096, 4096, 4096, "float32"), "h100")
    f = sl.workloads.matmul(256, 256, 256, "float32")
    s = rule.apply(f, "h100", config)
    steps = [step for step in s.trace.steps if step["primitive"] != "storage_permute"]
    assert len(steps) == len(s.trace.steps) - 1
    plain = sl.Schedule.from_trace(f, sl.Trace(steps))
    A, B = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    # without the permutation, the copy's lanes (which follow the permuted storage order) collide too
    for schedule, ways in ((s, 1.0), (plain, 2.0)):
        df = sl.build(schedule, "h100").bank_conflicts(A, B, blocks=1)
        b = df[df["buffer"] == "B_shared"].groupby("op")["conflict"].max()  # double-buffered: 2 store sites
        assert (b["vector load"], b["vector store"]) == (ways, ways), df.to_string()


@pytest.mark.parametrize(("out", "n", "store", "worst"), [("float32", 128, ("vector store", 8), 1.0),
                                                           ("bfloat16", 128, ("vector store", 4), 1.0),
                                                           ("float32", 120, ("load/store", 4), 2.0)])
def test_the_wgmma_epilogue_stages_column_pairs(rng: np.random.Generator, out: str, n: int, store: tuple,
                                                worst: float) -> None:
    """Each thread's two neighbouring columns go to the staging tile as one 4- or 8-byte store, and the rows'
    padding gives every lane of a phase its own banks (fp32 too).  A ragged N stores element by element (a
    pair could straddle the last column); for fp32 that pattern conflicts two ways whatever the padding."""
    f = sl.workloads.matmul(128, n, 64, "float16", out_dtype=out)
    kernel = sl.build(sl.rules.apply_default(f, "h100"), "h100")
    inputs = _inputs(f, rng)
    df = kernel.bank_conflicts(*inputs, blocks=1).set_index("op")
    assert (df.loc[store[0], "bytes"], df.loc[store[0], "conflict"]) == (store[1], worst), df.to_string()
    want = sl.run_reference(f, dict(zip(f.inputs, inputs)))[f.outputs[0]]
    np.testing.assert_allclose(np.asarray(kernel.run_cpu(*inputs), np.float64), np.asarray(want, np.float64),
                               rtol=2e-2, atol=2e-2)
