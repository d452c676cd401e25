// schedlib CUDA emulator: CUDA threads as user-level fibers, one thread block per OS thread.
//
// A block's threads are fibers that run until they wait (block or named barrier, warp-synchronous op,
// mbarrier phase, setmaxnreg) or exit; a waiting fiber hands control directly to the next ready fiber (one
// context switch per wait, no scheduler round trip). The last arrival at a barrier releases the others into
// the ready queue and, in a fast run, keeps running (a checked run keeps the block's order: see
// release_waiting). If the ready queue empties while threads still wait, nobody can ever
// release them: that is a deadlock and is reported with the kernel, block and waiting threads.
// Errors raised inside a fiber (bounds, deadlock) switch straight back to the block's scheduler;
// the abandoned fibers own no resources, their stacks are simply reused. A canary word at the
// bottom of each stack is checked when the fiber exits (stack overflow is then reported), and so is
// the fiber's cp.async and wgmma queues: a thread that exits with work in flight is reported.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sl_emu_block.h"

namespace sl_emu {

[[noreturn]] inline void fiber_main(void* fiber);
#ifdef SL_EMU_BANKS
inline void bank_fold(const BlockCtx* b, bool block_end);  // sl_emu_banks.h
#endif

#if !SL_EMU_ASM_SWITCH
inline void ucontext_entry() { fiber_main(sl_emu_tls_fiber); }
#endif

// Prepare `f` to start at fiber_main on the stack [lo, lo + bytes).
inline void ctx_init(Fiber* f, unsigned char* lo, size_t bytes) {
  f->canary = reinterpret_cast<uint64_t*>(lo);
  *f->canary = kCanary;
#if SL_EMU_ASM_SWITCH
  uintptr_t top = (reinterpret_cast<uintptr_t>(lo) + bytes - 64) & ~static_cast<uintptr_t>(15);
  void** sp = reinterpret_cast<void**>(top - 56);  // 6 saved registers + return address
  sp[0] = nullptr;                                   // r15
  sp[1] = nullptr;                                   // r14
  sp[2] = reinterpret_cast<void*>(&fiber_main);      // r13: function
  sp[3] = f;                                         // r12: argument
  sp[4] = nullptr;                                   // rbx
  sp[5] = nullptr;                                   // rbp
  sp[6] = reinterpret_cast<void*>(&sl_emu_fiber_entry);
  f->ctx.sp = sp;
#else
  getcontext(&f->ctx.uc);
  f->ctx.uc.uc_stack.ss_sp = lo;
  f->ctx.uc.uc_stack.ss_size = bytes;
  f->ctx.uc.uc_link = nullptr;
  makecontext(&f->ctx.uc, ucontext_entry, 0);
#endif
}

inline std::string thread_str(const Fiber& f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", f.tid.x, f.tid.y, f.tid.z);
  return buf;
}

inline std::string block_str(const BlockCtx& b) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", b.blockIdx.x, b.blockIdx.y, b.blockIdx.z);
  return buf;
}

// Abort the block: record the message and return to the scheduler; the fiber never resumes.
[[noreturn]] inline void fail_block(BlockCtx* b, Fiber* f, const std::string& msg) {
  b->failed = true;
  b->error = msg;
  ctx_switch(&f->ctx, &b->main);
  __builtin_unreachable();
}

// Report an error of thread f, prefixed with kernel, block and thread.
[[noreturn]] inline void fail_thread(BlockCtx* b, Fiber* f, const std::string& what) {
  fail_block(b, f, "kernel '" + std::string(b->kernel) + "' block " + block_str(*b) + " thread " +
                       thread_str(*f) + ": " + what);
}

// Report an error raised by the running thread.
[[noreturn]] inline void fail(const std::string& what) { fail_thread(sl_emu_tls_block, sl_emu_tls_fiber, what); }

[[noreturn]] __attribute__((noinline, cold)) inline void stack_overflow(BlockCtx* b, Fiber* f) {
  fail_thread(b, f, "fiber stack overflow; raise SCHEDLIB_EMU_STACK_KB");
}

// A thread exiting with asynchronous work in flight is an error; the reports live beside the operations
// (cp.async in sl_emu_warp.h, wgmma in sl_emu_wgmma.h).
[[noreturn]] inline void cp_async_pending_at_exit(BlockCtx* b, Fiber* f);
[[noreturn]] inline void wgmma_pending_at_exit(BlockCtx* b, Fiber* f);
// A lane exiting while the rest of its warp waits at a named barrier completes the warp's arrival
// (sl_emu_warp.h).
inline void named_barrier_on_exit(BlockCtx* b, Fiber* f);

inline void check_stack(BlockCtx* b, Fiber* f) {
  if (__builtin_expect(*f->canary != kCanary, 0)) stack_overflow(b, f);
}

[[noreturn]] __attribute__((noinline, cold)) inline void deadlock(BlockCtx* b, Fiber* self) {
  static const struct { int state; const char* what; } kWaits[] = {  // in the order the message lists them
      {kWaitBlock, "wait at __syncthreads()"},
      {kWaitWarp, "wait at a warp-synchronous operation (__shfl*_sync/__syncwarp/__ballot_sync/ldmatrix/mma"},
      {kExited, "already exited"},
      {kWaitMbarrier, "wait on an mbarrier phase that no arrival or copy completes"},
      {kWaitNamed, "wait at a named barrier (sl_named_barrier) for warps that never arrive"},
      {kWaitRegisters, "wait in setmaxnreg for the rest of their warpgroup, or for registers that no "
                       "setmaxnreg.dec gives back"},
  };
  std::string msg = "kernel '" + std::string(b->kernel) + "' block " + block_str(*b) +
                    ": barrier deadlock (it would hang on the GPU):";
  for (const auto& wait : kWaits) {
    int n = 0;
    const Fiber* first = nullptr;
    for (int i = 0; i < b->nthreads; ++i)
      if (b->fibers[i].state == wait.state && !n++) first = &b->fibers[i];
    if (!n) continue;
    msg += " " + std::to_string(n) + " thread(s) " + wait.what + (wait.state == kWaitWarp ? "; " : " (") +
           "first " + thread_str(*first);
    if (wait.state == kWaitWarp) msg += ", warp " + std::to_string(first->warp);
    if (wait.state == kWaitNamed) msg += ", barrier " + std::to_string(first->named);
    msg += ");";
  }
  msg += " every thread of the block must reach each __syncthreads(), every lane of a warp each "
         "warp-synchronous operation, and as many warps as a named barrier counts each of its uses";
  fail_block(b, self, msg);
}

// The registers per thread ptxas gives a kernel of `threads` threads that uses setmaxnreg (it must be
// compiled with __launch_bounds__(threads, 1), which codegen.warp_specialized.register_split assumes too):
// the register file shared out, in eights, at most 255.
inline int register_cap(int threads) {
  const int cap = 65536 / threads / 8 * 8;
  return cap < 255 ? cap : 255;
}

// The k-th of n threads in the block's order (last-first in a reversed block).
inline int nth_in_order(const BlockCtx* b, int n, int k) { return b->reversed ? n - 1 - k : k; }

inline void push_ready(BlockCtx* b, int i) {
  b->fibers[i].state = kReady;
  b->queue[b->qtail++ & b->qmask] = i;
}

// Leave the CPU to the next ready fiber; returns when someone has released `f`.
inline void wait_released(BlockCtx* b, Fiber* f) {
  if (b->qhead == b->qtail) deadlock(b, f);
  Fiber* next = &b->fibers[b->queue[b->qhead++ & b->qmask]];
  sl_emu_tls_fiber = next;
  ctx_switch(&f->ctx, &next->ctx);
}

// Wake the threads of [base, base + n) that `waiting(i)` names: a fast run queues them; a checked run puts them
// at the front of the queue in the block's order (pushed last-to-first, they run first-to-last), so that a
// warp completing a warp operation runs on ahead of the other warps, as in a fast run, which is what shows a
// warp reading another warp's shared data before that warp has finished writing it.
template <class Waiting>
inline void wake(BlockCtx* b, int base, int n, Waiting waiting) {
  if (!b->ordered) {
    for (int i = base; i < base + n; ++i)
      if (waiting(i)) push_ready(b, i);
    return;
  }
  for (int k = n - 1; k >= 0; --k) {
    const int i = base + nth_in_order(b, n, k);
    if (!waiting(i)) continue;
    b->fibers[i].state = kReady;
    b->queue[--b->qhead & b->qmask] = i;
  }
}

// Release the threads of [base, base + n) that `waiting(i)` names, the releasing thread (among them) always.
// A fast run queues the others and the releasing thread runs on.  A checked run keeps the block's order: the
// releasing thread takes its own place in it and waits for its turn (else the order would collapse after the
// first barrier).
template <class Waiting>
inline void release_waiting(BlockCtx* b, Fiber* self, int base, int n, Waiting waiting) {
  if (!b->ordered) {
    wake(b, base, n, [&](int i) { return i != self->linear && waiting(i); });
    return;
  }
  wake(b, base, n, [&](int i) { return i == self->linear || waiting(i); });
  if (b->queue[b->qhead & b->qmask] == self->linear) {
    ++b->qhead;  // its turn already
  } else {
    wait_released(b, self);
  }
}

inline void release_threads(BlockCtx* b, Fiber* self, int base, int n) {
  release_waiting(b, self, base, n, [](int) { return true; });
}

// Block barrier; returns how many threads passed a non-zero `pred` (the __syncthreads_count
// value). The count of the next barrier is cleared on release, which is safe: nobody can reach the
// next barrier before this one releases, nor the one after before everyone has read this count.
inline int syncthreads_impl(int pred = 0) {
  BlockCtx* b = sl_emu_tls_block;
  Fiber* f = sl_emu_tls_fiber;
  const unsigned p = b->bar_phase & 1u;
  b->bar_count[p] += pred != 0;
  if (++b->bar_arrivals == b->nthreads) {  // every thread waits here: release them all
#ifdef SL_EMU_BANKS
    bank_fold(b, false);  // every access before the barrier is logged: cost them, keep the log short
#endif
    b->bar_arrivals = 0;
    b->bar_count[p ^ 1u] = 0;
    ++b->bar_phase;
    release_threads(b, f, 0, b->nthreads);
  } else {
    f->state = kWaitBlock;
    wait_released(b, f);
  }
  return b->bar_count[p];
}

// Warp barrier; all existing lanes of the warp must arrive.
inline void warp_sync_impl(BlockCtx* b, Fiber* f) {
  Warp& w = b->warps[f->warp];
  if (++w.arrivals == w.size) {
    w.arrivals = 0;
    ++w.phase;
    release_threads(b, f, f->warp * 32, w.size);
    return;
  }
  f->state = kWaitWarp;
  wait_released(b, f);
}

// Deposit `bytes` of this lane's data, wait for the whole warp, and return the exchange buffer
// (lane l's data at offset l * kXSlot). It stays valid until this lane's next warp barrier:
// a lane can only overwrite this buffer two barriers later, after every lane has left this one.
inline const unsigned char* warp_exchange(const void* mine, size_t bytes) {
  BlockCtx* b = sl_emu_tls_block;
  Fiber* f = sl_emu_tls_fiber;
  Warp& w = b->warps[f->warp];
  unsigned char* buf = &w.xbuf[w.phase & 1u][0][0];
  std::memcpy(buf + f->lane * kXSlot, mine, bytes);
  warp_sync_impl(b, f);
  return buf;
}

[[noreturn]] inline void fiber_exit(BlockCtx* b, Fiber* f) {
  check_stack(b, f);
  if (__builtin_expect(!f->cp_pending.empty(), 0)) cp_async_pending_at_exit(b, f);
  if (__builtin_expect(!f->wg_pending.empty(), 0)) wgmma_pending_at_exit(b, f);
  f->state = kExited;
  ++b->exited;
  named_barrier_on_exit(b, f);
  if (b->qhead != b->qtail) {
    Fiber* next = &b->fibers[b->queue[b->qhead++ & b->qmask]];
    sl_emu_tls_fiber = next;
    ctx_switch(&f->ctx, &next->ctx);
  } else if (b->exited == b->nthreads) {
    ctx_switch(&f->ctx, &b->main);
  } else {
    deadlock(b, f);
  }
  __builtin_unreachable();
}

[[noreturn]] inline void fiber_main(void* fiber) {
  BlockCtx* b = sl_emu_tls_block;
  b->invoke(b->payload);
  fiber_exit(b, static_cast<Fiber*>(fiber));
}

// Run every thread of the current block (already described by `b`) to completion or error.
// Fiber i's stack is [stacks + i * stride, + stack_bytes).
inline void run_block(BlockCtx* b, unsigned char* stacks, size_t stride, size_t stack_bytes) {
  const unsigned bx = b->blockDim.x, bxy = b->blockDim.x * b->blockDim.y;
  b->qhead = b->qtail = 0;
  b->bar_arrivals = b->exited = 0;
  b->bar_phase = 0;
  b->bar_count[0] = b->bar_count[1] = 0;
  for (int& n : b->named_threads) n = 0;
  for (int& n : b->named_warps) n = 0;
  b->regs = RegisterFile{};
  for (int& r : b->regs.per_thread) r = register_cap(b->nthreads);
  b->failed = false;
#ifdef SL_EMU_BOUNDS
  // Threads run one at a time between barriers, so a missing barrier goes unseen whenever the writer happens
  // to run before its reader.  Checked runs keep one order per block through every release and alternate it
  // by block (the first block last-first, as a one-block grid runs), so such a race reads the poisoned
  // shared memory in one order or the other.
  const unsigned long long linear_block = b->blockIdx.x + static_cast<unsigned long long>(b->gridDim.x) *
      (b->blockIdx.y + static_cast<unsigned long long>(b->gridDim.y) * b->blockIdx.z);
  b->ordered = true;
  b->reversed = (linear_block & 1u) == 0;
#else
  b->ordered = b->reversed = false;
#endif
  for (int w = 0; w < b->nwarps; ++w) {
    b->warps[w].arrivals = 0;
    b->warps[w].phase = 0;
    b->warps[w].size = b->nthreads - 32 * w < 32 ? b->nthreads - 32 * w : 32;
  }
  for (int i = 0; i < b->nthreads; ++i) {
    Fiber& f = b->fibers[i];
    const unsigned u = static_cast<unsigned>(i);
    f.tid = {u % bx, (u / bx) % b->blockDim.y, u / bxy};
    f.linear = i;
    f.warp = i / 32;
    f.lane = i % 32;
    f.cp_pending.clear();  // each block starts with no cp.async state (the capacity stays)
    f.cp_commits = 0;
    f.wg_pending.clear();
    f.wg_commits = 0;
    ctx_init(&f, stacks + static_cast<size_t>(i) * stride, stack_bytes);
  }
  for (int k = 0; k < b->nthreads; ++k) push_ready(b, nth_in_order(b, b->nthreads, k));
  Fiber* first = &b->fibers[b->queue[b->qhead++ & b->qmask]];
  sl_emu_tls_fiber = first;
  ctx_switch(&b->main, &first->ctx);
  sl_emu_tls_fiber = nullptr;
}

}  // namespace sl_emu
