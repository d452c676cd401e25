// schedlib CUDA emulator: named barriers (PTX bar.sync id, count), which only the warps they count wait at.
// The running block's bookkeeping (threads and whole warps waiting at each of the 16 barriers, the count
// they gave) lives in BlockCtx (sl_emu_block.h); a lane that exits while the rest of its warp waits is
// handled from fiber_exit (sl_emu_fiber.h).
#pragma once
#include <string>

#include "sl_emu_memory.h"

namespace sl_emu {

// Whether every lane of `warp` that has not exited, but `self`, waits at named barrier `id`.
inline bool warp_waits_at(const BlockCtx* b, int warp, int id, int self) {
  for (int i = 32 * warp; i < 32 * warp + 32 && i < b->nthreads; ++i) {
    const Fiber& w = b->fibers[i];
    if (i != self && w.state != kExited && !(w.state == kWaitNamed && w.named == id)) return false;
  }
  return true;
}

// Named barrier `id` is done (its count of warps has arrived): the checks, then its waiters go on.  `f` is
// the running thread: the last to arrive, or a lane exiting while the rest of its warp waits.
inline void complete_named_barrier(BlockCtx* b, Fiber* f, int id, const std::string& op) {
  b->named_threads[id] = b->named_warps[id] = 0;
  auto waiting = [b, id](int i) {
    const Fiber& w = b->fibers[i];
    return w.state == kWaitNamed && w.named == id;
  };
  for (int i = 0; i < b->nthreads; ++i) {
    if (!waiting(i) || warp_waits_at(b, i / 32, id, f->linear)) continue;
    for (int lane = 32 * (i / 32); lane < 32 * (i / 32) + 32; ++lane)
      if (lane != f->linear && !waiting(lane) && b->fibers[lane].state != kExited)
        fail_thread(b, f, op + ": completed while lanes of warp " + std::to_string(i / 32) + " wait there "
                          "without thread " + thread_str(b->fibers[lane]) + " (a named barrier counts whole "
                          "warps: every lane that has not exited must arrive)");
  }
  if (f->state == kExited) {
    wake(b, 0, b->nthreads, waiting);
  } else {
    release_waiting(b, f, 0, b->nthreads, waiting);
  }
}

inline std::string named_op(int id, int count) {
  return "sl_named_barrier<" + std::to_string(id) + ", " + std::to_string(count) + ">";
}

// bar.sync id, count: a warp arrives when all its lanes that have not exited do (the last of them arriving,
// or exiting), and counts 32; the barrier is done when `count` threads have arrived so, and only those wait
// for each other.  Lanes of a warp left waiting when it completes, and two counts for one barrier at once,
// are undefined on the GPU and refused here.
inline void named_barrier_impl(int id, int count) {
  BlockCtx* b = sl_emu_tls_block;
  Fiber* f = sl_emu_tls_fiber;
  const std::string op = named_op(id, count);
  if (b->nthreads % 32)
    fail_thread(b, f, op + ": the emulator models named barriers in blocks of whole warps, not " +
                      std::to_string(b->nthreads) + " threads");
  if (count > b->nthreads)
    fail_thread(b, f, op + ": counts more threads than the block's " + std::to_string(b->nthreads) +
                      ", so it would never complete");
  if (b->named_threads[id] == 0) {
    b->named_count[id] = count;
  } else if (b->named_count[id] != count) {
    fail_thread(b, f, op + ": other threads wait at barrier " + std::to_string(id) + " with count " +
                      std::to_string(b->named_count[id]) + "; every use of a barrier must give the same count");
  }
  ++b->named_threads[id];
  f->named = id;
  if (warp_waits_at(b, f->warp, id, f->linear)) b->named_warps[id] += 32;
  if (b->named_warps[id] < count) {
    f->state = kWaitNamed;
    wait_released(b, f);
    return;
  }
  complete_named_barrier(b, f, id, op);
}

inline void named_barrier_on_exit(BlockCtx* b, Fiber* f) {
  for (int i = 32 * f->warp; i < 32 * f->warp + 32 && i < b->nthreads; ++i) {
    const Fiber& w = b->fibers[i];
    if (w.state != kWaitNamed) continue;
    const int id = w.named;  // the barrier the warp's other lanes wait at
    if (!warp_waits_at(b, f->warp, id, f->linear)) return;
    b->named_warps[id] += 32;
    if (b->named_warps[id] >= b->named_count[id])
      complete_named_barrier(b, f, id, named_op(id, b->named_count[id]));
    return;
  }
}

}  // namespace sl_emu

template <int ID, int COUNT>
inline void sl_named_barrier() {
  static_assert(ID >= 1 && ID < 16, "named barriers are 1..15 (barrier 0 is __syncthreads')");
  static_assert(COUNT > 0 && COUNT % 32 == 0, "a named barrier counts whole warps");
  ::sl_emu::named_barrier_impl(ID, COUNT);
}
