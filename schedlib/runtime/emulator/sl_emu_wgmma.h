// schedlib CUDA emulator: Hopper warpgroup MMA (wgmma.mma_async) with shared-memory descriptors.
//
// A warpgroup is 4 consecutive warps starting at a warp index divisible by 4. wgmma.mma_async
// .m64nNk16 computes D(64 x N) = A(64 x 16) * B(16 x N) + D with both operands read from shared
// memory through 64-bit matrix descriptors, and D spread over the warpgroup's registers the way
// mma.m16n8k16 spreads a 16 x 8 tile over a warp: warp w of the group holds rows 16w..16w+15, and
// register j of lane l is row 16w + l/4 + 8*((j%4)/2), column 8*(j/4) + 2*(l%4) + (j%2).
//
// Each thread owns its accumulators, so the emulator lets each thread compute its own N/2 elements
// straight from shared memory; no exchange between the warps is needed. Like cp.async, the
// operation is asynchronous here as on the GPU: issuing records it, and the sl_wgmma_wait that
// completes its group performs it, reading shared memory and the accumulators then. So a pipeline
// that refills a stage the tensor cores may still read, or reads the accumulators before waiting,
// computes with other data here too (depending on the fiber order) instead of passing by luck.
//
// Descriptors (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading
// dimension byte offset (LBO) >> 4, 32-45 stride dimension byte offset (SBO) >> 4, 49-51 base offset,
// 62-63 swizzle (0 none, 1 128B, 2 64B, 3 32B). The address is the shared-window address, which the
// emulator models as the byte offset into the launch's dynamic shared memory (sl_smem_addr): wgmma
// operands must live there. For 16-bit elements (T = 8 per 16 bytes) the canonical layouts are, in
// CuTe notation over element offsets, with W the swizzle width in bytes:
//   K-major,  swizzled:     ((8,m),(T,2)) : ((W/2, SBO), (1, T))        rows W bytes apart
//   K-major,  interleaved:  ((8,m),(T,2)) : ((T, SBO), (1, LBO))        8x16-byte core matrices
//   MN-major, swizzled:     ((T,W/16,m),(8,k)) : ((1,T,LBO), (W/2,SBO))
//   MN-major, interleaved:  ((T,1,m),(8,k)) : ((1,T,SBO), (T,LBO))
// and the swizzle acts on the byte address: bits [4, 4+b) ^= bits [7, 7+b), b = log2(W/16), which
// is why a swizzled tile must start on a (8 * W)-byte boundary (a nonzero base offset is refused).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "sl_emu_warp.h"

namespace sl_emu {

inline unsigned smem_addr(const void* p) {
  const BlockCtx* b = sl_emu_tls_block;
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (c < b->dyn_smem || c >= b->dyn_smem + b->dyn_bytes)
    fail("sl_smem_addr: the emulator models shared addresses as offsets into the launch's dynamic shared "
         "memory, and this pointer is not inside it (wgmma operands must be carved from SL_DYN_SHARED)");
  return static_cast<unsigned>(c - b->dyn_smem);
}

struct MatrixDesc {
  unsigned start, lbo, sbo, base_offset, swizzle_bytes;  // swizzle_bytes 0 = interleaved
};

inline MatrixDesc decode_desc(uint64_t d, const char* which) {
  static const unsigned widths[4] = {0, 128, 64, 32};
  MatrixDesc m{static_cast<unsigned>(d & 0x3FFF) << 4, static_cast<unsigned>((d >> 16) & 0x3FFF) << 4,
               static_cast<unsigned>((d >> 32) & 0x3FFF) << 4, static_cast<unsigned>((d >> 49) & 7),
               widths[(d >> 62) & 3]};
  if (m.base_offset != 0)
    fail(std::string("sl_wgmma: descriptor of ") + which + " has base offset " + std::to_string(m.base_offset) +
         "; the emulator supports swizzled tiles that start on their pattern boundary (base offset 0) only");
  return m;
}

// Byte address (shared window) of element (mn, k) of a 16-bit operand, after the swizzle.
inline unsigned operand_address(const MatrixDesc& m, bool mn_major, int mn, int k) {
  unsigned off;
  const unsigned w = m.swizzle_bytes;
  if (!mn_major) {
    off = w ? (mn / 8) * m.sbo + (mn % 8) * w + k * 2
            : (mn / 8) * m.sbo + (mn % 8) * 16 + (k / 8) * m.lbo + (k % 8) * 2;
  } else {
    off = w ? (mn % (w / 2)) * 2 + (mn / (w / 2)) * m.lbo + (k % 8) * w + (k / 8) * m.sbo
            : (mn % 8) * 2 + (mn / 8) * m.sbo + (k % 8) * 16 + (k / 8) * m.lbo;
  }
  unsigned addr = m.start + off;
  if (w) {
    const unsigned bits = w == 128 ? 7u : w == 64 ? 3u : 1u;
    addr ^= ((addr >> 7) & bits) << 4;
  }
  return addr;
}

inline uint16_t operand_element(const MatrixDesc& m, bool mn_major, int mn, int k, const char* which) {
  const BlockCtx* b = sl_emu_tls_block;
  const unsigned addr = operand_address(m, mn_major, mn, k);
  if (static_cast<size_t>(addr) + 2 > b->dyn_bytes)
    fail(std::string("sl_wgmma: ") + which + " element (" + std::to_string(mn) + ", " + std::to_string(k) +
         ") lies at shared address " + std::to_string(addr) + ", past the " + std::to_string(b->dyn_bytes) +
         " bytes of dynamic shared memory: the descriptor's start, LBO or SBO is wrong");
  uint16_t v;
  std::memcpy(&v, b->dyn_smem + addr, 2);
  return v;
}

// Perform one recorded wgmma for the calling thread: its N/2 accumulator elements.
inline void wgmma_perform(const Fiber* f, const WgmmaOp& op) {
  const MatrixDesc a = decode_desc(op.desc_a, "A"), bd = decode_desc(op.desc_b, "B");
  float (*cvt)(uint16_t) = op.bf16 ? bf2f : h2f;
  const int w = (f->linear / 32) % 4, g = f->lane >> 2, t = f->lane & 3;
  float arow[2][16];
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 16; ++k) arow[h][k] = cvt(operand_element(a, op.trans_a, 16 * w + g + 8 * h, k, "A"));
  for (int c = 0; c < op.n / 8; ++c) {
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * c + 2 * t + e;
      float bcol[16];
      for (int k = 0; k < 16; ++k) bcol[k] = cvt(operand_element(bd, op.trans_b, col, k, "B"));
      for (int h = 0; h < 2; ++h) {
        float acc = 0.0f;
        for (int k = 0; k < 16; ++k) acc += arow[h][k] * bcol[k];
        float& d = op.d[4 * c + 2 * h + e];
        d = acc + d;
      }
    }
  }
}

inline void wgmma_issue(float* d, uint64_t desc_a, uint64_t desc_b, int n, bool ta, bool tb, bool bf16) {
  const BlockCtx* b = sl_emu_tls_block;
  Fiber* f = sl_emu_tls_fiber;
  if (b->nthreads % 128)
    fail("sl_wgmma: the block has " + std::to_string(b->nthreads) +
         " threads; wgmma runs on warpgroups of 4 full warps, so it needs a multiple of 128");
  for (const auto& [desc, which] : {std::make_pair(desc_a, "A"), std::make_pair(desc_b, "B")}) {
    const unsigned start = decode_desc(desc, which).start;
    if (start >= b->dyn_bytes)
      fail(std::string("sl_wgmma: the descriptor of ") + which + " starts at shared address " + std::to_string(start) +
           ", past the " + std::to_string(b->dyn_bytes) + " bytes of dynamic shared memory");
  }
  if (f->wg_pending.size() >= 4096)
    fail("sl_wgmma: 4096 wgmma operations of this thread are in flight; the kernel never waits (sl_wgmma_wait)");
  f->wg_pending.push_back(WgmmaOp{d, desc_a, desc_b, n, ta, tb, bf16, f->wg_commits});
}

inline void wgmma_complete_before(Fiber* f, unsigned long long group) {
  std::vector<WgmmaOp>& q = f->wg_pending;
  size_t n = 0;
  for (; n < q.size() && q[n].group < group; ++n) wgmma_perform(f, q[n]);
  if (n) q.erase(q.begin(), q.begin() + static_cast<ptrdiff_t>(n));
}

// Like cp.async (sl_emu_warp.h): an operation no wait completed was never performed on the GPU either.
[[noreturn]] __attribute__((noinline, cold)) inline void wgmma_pending_at_exit(BlockCtx* b, Fiber* f) {
  fail_thread(b, f, "exits with " + std::to_string(f->wg_pending.size()) + " wgmma.mma_async operation(s) "
                    "never completed: commit them (sl_wgmma_commit) and wait (sl_wgmma_wait<N>) before the "
                    "accumulators are read");
}

// setmaxnreg.{inc,dec}.sync.aligned: every thread of the warpgroup executes the same one; dec returns
// (current - n) registers per thread to the CTA's pool, inc waits until the pool holds (n - current) per
// thread.  The registers themselves are not modelled, only the pool, so that a split that does not add up
// hangs here as on the GPU (where ptxas checks nothing of it).
// Grant every pending inc the pool now holds; wake the warpgroups granted, but `settling` (whose thread grants,
// and releases its own warpgroup itself).
inline void grant_registers(BlockCtx* b, int settling) {
  RegisterFile& r = b->regs;
  for (int g = 0; g < b->nthreads / 128; ++g) {
    const long long need = 128ll * (r.pending[g] - r.per_thread[g]);
    if (!r.pending[g] || r.pool < need) continue;
    r.pool -= need;
    r.per_thread[g] = r.pending[g];
    r.pending[g] = 0;
    if (g != settling) wake(b, 128 * g, 128, [b](int i) { return b->fibers[i].state == kWaitRegisters; });
  }
}

inline void setmaxnreg(bool inc, int n) {
  BlockCtx* b = sl_emu_tls_block;
  Fiber* f = sl_emu_tls_fiber;
  RegisterFile& r = b->regs;
  const std::string op = std::string(inc ? "setmaxnreg.inc " : "setmaxnreg.dec ") + std::to_string(n);
  if (b->nthreads % 128)
    fail_thread(b, f, op + ": needs a block of whole warpgroups (128 threads), not " + std::to_string(b->nthreads));
  const int g = f->linear / 128;
  const int request = inc ? n : -n;
  if (r.arrivals[g] == 0) {
    r.request[g] = request;
  } else if (r.request[g] != request) {
    fail_thread(b, f, op + ": other threads of warpgroup " + std::to_string(g) + " wait in setmaxnreg." +
                      (r.request[g] > 0 ? "inc " : "dec ") + std::to_string(std::abs(r.request[g])) +
                      " (every thread of a warpgroup must execute the same setmaxnreg)");
  }
  if (++r.arrivals[g] < 128) {
    f->state = kWaitRegisters;
    wait_released(b, f);
    return;
  }
  r.arrivals[g] = 0;
  const int current = r.per_thread[g];
  if (inc ? n < current : n > current)
    fail_thread(b, f, op + ": warpgroup " + std::to_string(g) + " has " + std::to_string(current) +
                      " registers per thread; inc may not lower them nor dec raise them");
  if (inc) {
    r.pending[g] = n;
  } else {
    r.pool += 128ll * (current - n);
    r.per_thread[g] = n;
  }
  grant_registers(b, g);  // this warpgroup's inc, or incs the registers just returned complete
  if (r.pending[g]) {  // nothing returns the registers yet: the warpgroup waits
    f->state = kWaitRegisters;
    wait_released(b, f);
    return;
  }
  release_waiting(b, f, 128 * g, 128, [b](int i) { return b->fibers[i].state == kWaitRegisters; });
}

}  // namespace sl_emu

inline unsigned sl_smem_addr(const void* p) {
  ::sl_emu::bank_forget(p);
  return ::sl_emu::smem_addr(p);
}
// Ordering points with no data of their own: on the GPU they order register and shared-memory
// accesses against the asynchronous proxy; the emulator's deferred execution needs no such help.
inline void sl_wgmma_fence() {}
inline void sl_fence_proxy_async() {}
inline void sl_wgmma_commit() { ++sl_emu_tls_fiber->wg_commits; }
template <int N>
inline void sl_setmaxnreg_dec() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
  ::sl_emu::setmaxnreg(false, N);
}
template <int N>
inline void sl_setmaxnreg_inc() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
  ::sl_emu::setmaxnreg(true, N);
}
template <int N>
inline void sl_wgmma_wait() {
  static_assert(N >= 0, "wgmma.wait_group takes a non-negative constant");
  ::sl_emu::Fiber* f = sl_emu_tls_fiber;
  if (f->wg_commits > static_cast<unsigned long long>(N))
    ::sl_emu::wgmma_complete_before(f, f->wg_commits - static_cast<unsigned long long>(N));
}

// sl_wgmma_n<N>_<type><TRANS_A, TRANS_B>(d, desc_a, desc_b): D += A * B, m64nNk16, f32 accumulate.
#define SL_EMU_WGMMA(N)                                                                          \
  template <int TA, int TB>                                                                      \
  inline void sl_wgmma_n##N##_f16(float* d, unsigned long long da, unsigned long long db) {      \
    ::sl_emu::wgmma_issue(d, da, db, N, TA != 0, TB != 0, false);                                \
  }                                                                                              \
  template <int TA, int TB>                                                                      \
  inline void sl_wgmma_n##N##_bf16(float* d, unsigned long long da, unsigned long long db) {     \
    ::sl_emu::wgmma_issue(d, da, db, N, TA != 0, TB != 0, true);                                 \
  }
SL_EMU_WGMMA(16)
SL_EMU_WGMMA(32)
SL_EMU_WGMMA(64)
SL_EMU_WGMMA(128)
SL_EMU_WGMMA(256)
#undef SL_EMU_WGMMA
