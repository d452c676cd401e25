"""cp.async in the emulator is asynchronous per thread, as on the GPU (PTX ISA cp.async.commit_group /
cp.async.wait_group): a copy lands only at the issuing thread's wait_group that completes its group, so a kernel
that reads a stage before its wait + barrier, or waits on the wrong group, computes with stale shared memory here
too, and a thread that exits with copies in flight is a reported error.
"""

from __future__ import annotations

import numpy as np
import pytest
from emu_kernels import full, needs_gxx, poisoned

import schedlib as sl
from schedlib.errors import EmulatorError
from schedlib.rules import get_rule
from schedlib.runtime.emulator import KernelLaunch, emulate

pytestmark = needs_gxx
WARP = ((1, 1, 1), (32, 1, 1))
BOUNDS = pytest.mark.parametrize("bounds", [False, True], ids=["raw", "bounds"])

# Thread t copies 16 bytes (chunk t) into shared memory and reads back chunk t + 1, which thread t + 1 copied.
# read_early = 0: commit, wait, barrier, read (correct). 1: commit, barrier, read, barrier, wait (reads before the
# wait: a race on the GPU, which the emulator always loses).
ROUNDTRIP = r"""
extern "C" __global__ void cp_roundtrip(SL_GLOBAL(const float) x, SL_GLOBAL(float) y, int read_early) {
  SL_SHARED(float, buf, 128);
  const int t = threadIdx.x, next = (t + 1) % 32;
  SL_VSTORE(float4, buf, 4 * t, make_float4(-1.0f, -1.0f, -1.0f, -1.0f));  // the old contents
  __syncthreads();
  sl_cp_async_16(&buf[4 * t], &x[4 * t]);
  sl_cp_async_commit();
  if (!read_early) sl_cp_async_wait<0>();
  __syncthreads();
  SL_VSTORE(float4, y, 4 * t, SL_VLOAD(float4, buf, 4 * next));
  __syncthreads();  // every read happens before any late wait
  if (read_early) sl_cp_async_wait<0>();
}
"""

# Four regions of shared memory, one 16-byte chunk per thread each; out holds four snapshots of the thread's own
# chunks (a thread sees its own completed copies without a barrier).
GROUPS = r"""
extern "C" __global__ void cp_groups(SL_GLOBAL(const float) x, SL_GLOBAL(float) out) {
  SL_SHARED(float, s, 4 * 128);
  const int t = threadIdx.x;
  for (int r = 0; r < 4; ++r) SL_VSTORE(float4, s, r * 128 + 4 * t, make_float4(-1.0f, -1.0f, -1.0f, -1.0f));
  auto copy = [&](int r) { sl_cp_async_16(&s[r * 128 + 4 * t], &x[r * 128 + 4 * t]); };
  auto snap = [&](int k) {
    for (int r = 0; r < 4; ++r) SL_VSTORE(float4, out, (k * 4 + r) * 128 + 4 * t, SL_VLOAD(float4, s, r * 128 + 4 * t));
  };
  copy(0); sl_cp_async_commit();  // group 0
  copy(1); sl_cp_async_commit();  // group 1
  sl_cp_async_wait<1>(); snap(0);  // group 0 landed, group 1 not yet
  copy(2);                         // issued, not committed
  sl_cp_async_wait<0>(); snap(1);  // groups 0 and 1; the uncommitted copy is not waited for
  sl_cp_async_commit();            // group 2 = {copy 2}
  copy(3); sl_cp_async_commit();   // group 3
  sl_cp_async_commit();            // group 4, empty: still a group
  sl_cp_async_wait<2>(); snap(2);  // groups 0..2
  sl_cp_async_wait<0>(); snap(3);  // everything
}
"""

# Thread 3 leaves its copy uncommitted (mode 0) or committed but never waited for (mode 1). The others wait,
# then end with two committed empty groups they never wait for, which is fine (empty groups are complete).
LEAK = r"""
extern "C" __global__ void cp_leak(SL_GLOBAL(const float) x, SL_GLOBAL(float) y, int mode) {
  SL_SHARED(float, buf, 128);
  const int t = threadIdx.x;
  sl_cp_async_16(&buf[4 * t], &x[4 * t]);
  if (t != 3 || mode == 1) sl_cp_async_commit();
  if (t != 3) {
    sl_cp_async_wait<0>();
    sl_cp_async_commit();
    sl_cp_async_commit();
  }
  y[t] = 1.0f;
}
"""

# One thread issues copies to the same 16 bytes and never waits: unordered on the GPU, and unbounded here.
FLOOD = r"""
extern "C" __global__ void cp_flood(SL_GLOBAL(const float) x, SL_GLOBAL(float) y) {
  SL_SHARED(float, buf, 4);
  for (int i = 0; i < 20000; ++i) { sl_cp_async_16(&buf[0], &x[0]); sl_cp_async_commit(); }
  sl_cp_async_wait<0>();
  y[0] = buf[0];
}
"""


@BOUNDS
def test_copy_lands_at_the_wait(rng: np.random.Generator, bounds: bool) -> None:
    """Three blocks on one OS thread: the fibers, and their cp.async queues, are reused block after block."""
    x = rng.standard_normal(128).astype(np.float32)
    y = poisoned(128)
    emulate(full(ROUNDTRIP), [KernelLaunch("cp_roundtrip", (3, 1, 1), (32, 1, 1), ("x", "y", "read_early"))],
            {"x": x, "y": y, "read_early": 0}, bounds_check=bounds, threads=1)
    np.testing.assert_array_equal(y, np.roll(x.reshape(32, 4), -1, axis=0).ravel())


@BOUNDS
def test_reading_before_the_wait_sees_the_old_contents(rng: np.random.Generator, bounds: bool) -> None:
    """A synchronous cp.async would hand every thread its neighbour's data; on the GPU that read races with the
    copy, and here it deterministically loses: no copy has landed before its own thread's wait."""
    x = rng.standard_normal(128).astype(np.float32)
    y = poisoned(128)
    emulate(full(ROUNDTRIP), [KernelLaunch("cp_roundtrip", *WARP, ("x", "y", "read_early"))],
            {"x": x, "y": y, "read_early": 1}, bounds_check=bounds)
    np.testing.assert_array_equal(y, np.full(128, -1.0, np.float32))


@BOUNDS
def test_wait_group_completes_all_but_the_newest_committed_groups(rng: np.random.Generator, bounds: bool) -> None:
    x = rng.standard_normal(4 * 128).astype(np.float32)
    out = poisoned(4 * 4 * 128)
    emulate(full(GROUPS), [KernelLaunch("cp_groups", *WARP, ("x", "out"))], {"x": x, "out": out},
            bounds_check=bounds)
    snaps = out.reshape(4, 4, 128)  # snapshot k, region r
    regions = x.reshape(4, 128)
    old = np.full(128, -1.0, np.float32)
    landed = {0: (0,), 1: (0, 1), 2: (0, 1, 2), 3: (0, 1, 2, 3)}
    for k, done in landed.items():
        for r in range(4):
            np.testing.assert_array_equal(snaps[k, r], regions[r] if r in done else old, err_msg=f"snapshot {k} r{r}")


@pytest.mark.parametrize("mode, pending", [(0, "1 never committed"), (1, "1 in committed groups never waited for")])
def test_exiting_with_copies_in_flight_is_reported(rng: np.random.Generator, mode: int, pending: str) -> None:
    x = rng.standard_normal(128).astype(np.float32)
    launch = [KernelLaunch("cp_leak", *WARP, ("x", "y", "mode"))]
    with pytest.raises(EmulatorError) as err:
        emulate(full(LEAK), launch, {"x": x, "y": poisoned(32), "mode": mode}, bounds_check=True)
    msg = str(err.value)
    assert "kernel 'cp_leak' block (0,0,0) thread (3,0,0): exits with 1 cp.async copy still pending" in msg
    assert pending in msg and "shared buffer 'buf' at byte 48" in msg
    raw = r"cp_leak.*thread \(3,0,0\).*1 cp.async copy still pending.*shared address"
    with pytest.raises(EmulatorError, match=raw):  # no buffer names without bounds mode
        emulate(full(LEAK), launch, {"x": x, "y": poisoned(32), "mode": mode})


def test_broken_generated_pipelines_are_caught(rng: np.random.Generator) -> None:
    """The generated 3-stage tensor-core matmul is right; the same kernel waiting one group too few, or skipping
    the barrier after its wait, reads stages whose copies have not landed, and the emulator shows it.

    A is stored K x M so that each warp's first ldmatrix reads rows another warp copied: fibers advance warp by
    warp one warp-synchronous op at a time, so a missing barrier shows only where a warp reads another warp's
    copies before that warp's wait has run (with A stored M x K, warp 0's A rows are its own copies and warp 1
    has waited by the time warp 0 reads B: the dropped barrier goes unnoticed)."""
    f = sl.workloads.matmul(64, 64, 96, "float16", trans_a=True)
    config = {"block_m": 32, "block_n": 32, "block_k": 16, "thread_m": 2, "thread_n": 4, "vector": 1, "split_k": 1,
              "stages": 3, "tensor_core": True, "raster": 1}
    kernel = sl.build(get_rule("matmul").apply(f, "h100", config), "h100")
    (spec,) = kernel.launch
    marker = "// ---- end of the schedlib CUDA prelude ----"
    prelude, body = kernel.source.split(marker)
    wait, sync = "sl_cp_async_wait<1>();", "sl_cp_async_wait<1>();\n    __syncthreads();"
    assert body.count(wait) == 1 and body.count(sync) == 1
    epilogue = "const int sl_row ="
    variants = {
        "ok": body,
        # one group too few: tile kt is still in flight when it is read (the final wait<0> only avoids the
        # exit error, so that the stale data itself is what fails)
        "wrong_group": body.replace(wait, "sl_cp_async_wait<2>();").replace(
            epilogue, "sl_cp_async_wait<0>();\n        " + epilogue),
        "no_barrier": body.replace(sync, wait),  # own copies landed, the other threads' not yet
        "wrong_group_exit": body.replace(wait, "sl_cp_async_wait<2>();"),
    }
    A = rng.standard_normal((96, 64)).astype(np.float16)  # K x M
    B = rng.standard_normal((96, 64)).astype(np.float16)
    want = A.T.astype(np.float64) @ B.astype(np.float64)
    source = prelude + marker + "".join(b.replace(f" {spec.name}(", f" {spec.name}_{v}(") for v, b in variants.items())
    outs = {}
    for v in ("ok", "wrong_group", "no_barrier"):
        outs[v] = np.full((64, 64), np.nan, np.float16)
        args = {"A": A, "B": B, "D": outs[v]}
        emulate(source, [KernelLaunch(f"{spec.name}_{v}", spec.grid_for({}), spec.block, spec.params)], args,
                bounds_check=True)
    np.testing.assert_allclose(outs["ok"].astype(np.float64), want, rtol=1e-2, atol=1e-2)
    for v in ("wrong_group", "no_barrier"):
        assert not np.allclose(outs[v].astype(np.float64), want, rtol=1e-2, atol=1e-2), v
    with pytest.raises(EmulatorError, match=r"exits with \d+ cp.async copies still pending \(\d+ in committed groups"):
        emulate(source, [KernelLaunch(f"{spec.name}_wrong_group_exit", spec.grid_for({}), spec.block, spec.params)],
                {"A": A, "B": B, "D": np.zeros((64, 64), np.float16)}, bounds_check=True)


def test_copies_in_flight_are_bounded() -> None:
    """A thread's queue holds at most one pending copy per 16 bytes of the GPU's 227 KiB of shared memory."""
    with pytest.raises(EmulatorError, match=r"cp_flood.*thread \(0,0,0\): sl_cp_async_16: 14528 copies .* in flight"):
        emulate(full(FLOOD), [KernelLaunch("cp_flood", (1, 1, 1), (1, 1, 1), ("x", "y"))],
                {"x": np.zeros(4, np.float32), "y": poisoned(1)})
