// schedlib CUDA emulator: barriers and warp-collective operations.
//
// Lanes are linear thread id % 32 within the block. Every warp-collective op (shuffle, vote,
// __syncwarp, ldmatrix, mma) is a warp barrier plus a data exchange, so lanes see each other's
// values exactly as in lock-step execution. All existing lanes of the warp must take part (masks
// that leave lanes out are refused), and a lane whose partner never arrives is a reported deadlock.
// ldmatrix and mma follow the per-lane fragment layouts of the PTX ISA, so fragments built here
// are bit-for-bit the ones the GPU would hold. cp.async is asynchronous per thread (see below).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "sl_emu_memory.h"
#include "sl_emu_named_barrier.h"

inline void __syncthreads() { ::sl_emu::syncthreads_impl(); }
inline int __syncthreads_count(int pred) { return ::sl_emu::syncthreads_impl(pred); }
inline int __syncthreads_and(int pred) {
  return ::sl_emu::syncthreads_impl(pred) == sl_emu_tls_block->nthreads;
}
inline int __syncthreads_or(int pred) { return ::sl_emu::syncthreads_impl(pred) != 0; }

namespace sl_emu {

inline unsigned lanes_present(const BlockCtx* b, const Fiber* f) {
  const int size = b->warps[f->warp].size;
  return size == 32 ? 0xffffffffu : ((1u << size) - 1u);
}

inline void check_mask(unsigned mask, const char* op) {
  const BlockCtx* b = sl_emu_tls_block;
  const Fiber* f = sl_emu_tls_fiber;
  const unsigned present = lanes_present(b, f);
  if ((mask & present) != present)
  {
    char m[16];
    std::snprintf(m, sizeof m, "0x%08x", mask);
    fail(std::string(op) + ": mask " + m + " leaves out lanes of the warp; the emulator needs every lane of the warp to take part");
  }
}

enum ShflMode { kShflIdx, kShflUp, kShflDown, kShflXor };

// Source lane per the PTX shfl.sync rules (clamp c = ((32 - width) << 8) | (up ? 0 : 31)).
inline int shfl_source(int lane, ShflMode mode, unsigned b, int width) {
  const unsigned seg = static_cast<unsigned>(32 - width) & 31u;
  const unsigned cval = mode == kShflUp ? 0u : 31u;
  const int max_lane = static_cast<int>((lane & seg) | (cval & ~seg));
  const int min_lane = static_cast<int>(lane & seg);
  const int bv = static_cast<int>(b & 31u);
  int j = lane;
  bool ok = false;
  switch (mode) {
    case kShflUp: j = lane - bv; ok = j >= max_lane; break;
    case kShflDown: j = lane + bv; ok = j <= max_lane; break;
    case kShflXor: j = lane ^ bv; ok = j <= max_lane; break;
    case kShflIdx: j = min_lane | (bv & ~static_cast<int>(seg)); ok = j <= max_lane; break;
  }
  return ok ? j : lane;
}

template <class T>
inline T shfl(unsigned mask, T var, ShflMode mode, unsigned b, int width, const char* op) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffled values must be <= 8 bytes");
  check_mask(mask, op);
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    fail(std::string(op) + ": width " + std::to_string(width) + " is not a power of two in [1, 32]");
  const unsigned char* buf = warp_exchange(&var, sizeof(T));
  const Fiber* f = sl_emu_tls_fiber;
  const int j = shfl_source(f->lane, mode, b, width);
  if (j >= sl_emu_tls_block->warps[f->warp].size)
    fail(std::string(op) + ": reads lane " + std::to_string(j) + ", which does not exist (the block's last warp has " +
         std::to_string(sl_emu_tls_block->warps[f->warp].size) + " lanes)");
  T out;
  std::memcpy(&out, buf + j * kXSlot, sizeof(T));
  return out;
}

}  // namespace sl_emu

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return ::sl_emu::shfl(mask, var, ::sl_emu::kShflIdx, static_cast<unsigned>(src_lane), width, "__shfl_sync");
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::sl_emu::shfl(mask, var, ::sl_emu::kShflUp, delta, width, "__shfl_up_sync");
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::sl_emu::shfl(mask, var, ::sl_emu::kShflDown, delta, width, "__shfl_down_sync");
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return ::sl_emu::shfl(mask, var, ::sl_emu::kShflXor, static_cast<unsigned>(lane_mask), width, "__shfl_xor_sync");
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::sl_emu::check_mask(mask, "__syncwarp");
  ::sl_emu::warp_sync_impl(sl_emu_tls_block, sl_emu_tls_fiber);
}

// The emulator does not track divergence: every lane of the warp that exists counts as active.
inline unsigned __activemask() { return ::sl_emu::lanes_present(sl_emu_tls_block, sl_emu_tls_fiber); }

inline unsigned __ballot_sync(unsigned mask, int pred) {
  ::sl_emu::check_mask(mask, "__ballot_sync");
  const int mine = pred != 0;
  const unsigned char* buf = ::sl_emu::warp_exchange(&mine, sizeof mine);
  unsigned out = 0;
  const int size = sl_emu_tls_block->warps[sl_emu_tls_fiber->warp].size;
  for (int l = 0; l < size; ++l) {
    int v;
    std::memcpy(&v, buf + l * ::sl_emu::kXSlot, sizeof v);
    if (v) out |= 1u << l;
  }
  return out & mask;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == (mask & __activemask()); }

namespace sl_emu {

inline uint16_t load_b16(const unsigned char* row, int col) {
  uint16_t v;
  std::memcpy(&v, row + 2 * col, 2);
  return v;
}

// ldmatrix.m8n8.b16: lanes 8i..8i+7 give the row addresses of matrix i; lane l receives
// row l/4, columns 2(l%4) and 2(l%4)+1 of each matrix (transposed: rows 2(l%4), 2(l%4)+1 of column l/4).
template <int NMAT, bool TRANS>
inline void ldmatrix(unsigned* r, const void* row_ptr, const char* op, const void* site) {
  const Fiber* f = sl_emu_tls_fiber;
  const char* buffer = bank_forget(row_ptr);
  if (f->lane < 8 * NMAT) {
    check_align(row_ptr, 16, op, std::string(": row address of lane ") + std::to_string(f->lane));
#ifdef SL_EMU_BOUNDS
    check_bytes(row_ptr, 16, true, op);
#endif
#ifdef SL_EMU_BANKS
    bank_note(site, row_ptr, 16, buffer ? buffer : "shared", op);  // lanes 8i..8i+7: one phase of 16-byte rows per matrix
#endif
  }
  const unsigned char* buf = warp_exchange(&row_ptr, sizeof row_ptr);
  if (sl_emu_tls_block->warps[f->warp].size != 32) fail(std::string(op) + " needs a full warp of 32 threads");
  const int g = f->lane >> 2, t = f->lane & 3;
  for (int i = 0; i < NMAT; ++i) {
    const unsigned char* rows[8];
    for (int k = 0; k < 8; ++k) std::memcpy(&rows[k], buf + (8 * i + k) * kXSlot, sizeof(void*));
    const uint16_t lo = TRANS ? load_b16(rows[2 * t], g) : load_b16(rows[g], 2 * t);
    const uint16_t hi = TRANS ? load_b16(rows[2 * t + 1], g) : load_b16(rows[g], 2 * t + 1);
    r[i] = static_cast<unsigned>(lo) | (static_cast<unsigned>(hi) << 16);
  }
}

// mma.m16n8k16.row.col with f32 accumulate. A fragment: reg (r>=8) + 2*(k>=8) of lane
// (r%8)*4 + (k%8)/2, half k&1; B fragment: reg (k>=8) of lane n*4 + (k%8)/2, half k&1;
// C/D: element i of lane l is row l/4 + 8*(i>=2), column 2*(l%4) + (i&1).
template <float (*CVT)(uint16_t)>
inline void mma_m16n8k16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4], const char* op) {
  unsigned mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  const unsigned char* buf = warp_exchange(mine, sizeof mine);
  const Fiber* f = sl_emu_tls_fiber;
  if (sl_emu_tls_block->warps[f->warp].size != 32) fail(std::string(op) + " needs a full warp of 32 threads");
  auto reg = [buf](int lane, int idx) {
    unsigned v;
    std::memcpy(&v, buf + lane * kXSlot + idx * 4, 4);
    return v;
  };
  auto A = [&](int r, int k) {
    const unsigned v = reg((r % 8) * 4 + (k % 8) / 2, (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0));
    return CVT(static_cast<uint16_t>((k & 1) ? v >> 16 : v & 0xffffu));
  };
  auto B = [&](int k, int n) {
    const unsigned v = reg(n * 4 + (k % 8) / 2, 4 + (k >= 8 ? 1 : 0));
    return CVT(static_cast<uint16_t>((k & 1) ? v >> 16 : v & 0xffffu));
  };
  const int g = f->lane >> 2, t = f->lane & 3;
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float acc = 0.0f;
    for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    out[i] = acc + c[i];
  }
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

}  // namespace sl_emu

inline void sl_mma_m16n8k16_f16f32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  ::sl_emu::mma_m16n8k16<::sl_emu::h2f>(d, a, b, c, "sl_mma_m16n8k16_f16f32");
}
inline void sl_mma_m16n8k16_bf16f32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  ::sl_emu::mma_m16n8k16<::sl_emu::bf2f>(d, a, b, c, "sl_mma_m16n8k16_bf16f32");
}
SL_EMU_SITE_FN inline void sl_ldmatrix_x4(unsigned r[4], const void* p) {
  ::sl_emu::ldmatrix<4, false>(r, p, "ldmatrix.x4", SL_EMU_SITE);
}
SL_EMU_SITE_FN inline void sl_ldmatrix_x2(unsigned r[2], const void* p) {
  ::sl_emu::ldmatrix<2, false>(r, p, "ldmatrix.x2", SL_EMU_SITE);
}
SL_EMU_SITE_FN inline void sl_ldmatrix_x4_trans(unsigned r[4], const void* p) {
  ::sl_emu::ldmatrix<4, true>(r, p, "ldmatrix.x4.trans", SL_EMU_SITE);
}
SL_EMU_SITE_FN inline void sl_ldmatrix_x2_trans(unsigned r[2], const void* p) {
  ::sl_emu::ldmatrix<2, true>(r, p, "ldmatrix.x2.trans", SL_EMU_SITE);
}

// cp.async, asynchronous as on the GPU, so that a pipeline that waits on the wrong group or reads a
// stage before its wait + barrier computes with stale shared memory here too. PTX ISA,
// "cp.async.commit_group": it "batches all prior cp.async instructions initiated by the executing
// thread but not committed to any cp.async-group into the new cp.async-group. If there are no
// uncommitted cp.async instructions then cp.async.commit_group results in an empty cp.async-group."
// PTX ISA, "cp.async.wait_group / cp.async.wait_all": wait_group N waits "till only N or fewer of
// the most recent cp.async-groups are pending and all the prior cp.async-groups committed by the
// executing threads are complete", and "cp.async.wait_all is equivalent to: cp.async.commit_group;
// cp.async.wait_group 0;" -- that commit would be pointless if wait_group also completed uncommitted
// copies, so it does not: copies issued after the last commit stay pending here.
//
// So each thread (fiber) keeps its issued copies in order, tagged with their group (the number of
// commits before the issue): sl_cp_async_16 records and writes nothing, sl_cp_async_commit counts a
// group (empty or not), sl_cp_async_wait<N> performs the copies of every committed group except the
// newest N, oldest first. The data lands at the latest legal moment, the completing wait, and only
// the issuing thread's wait completes it. Another thread may rely on it only after that wait and a
// later barrier, which is all the GPU guarantees; a thread that skips the barrier reads stale data
// here whenever the fiber order runs its read before the copying thread's wait.
//
// The source is read at completion, not captured at issue. The GPU may read it at any time between
// the issue and the completing wait, so both are legal; reading last is the stricter choice: a write
// to the source after the issue (by this thread or any other, say a producer that fills the global
// buffer late) races on the GPU and changes the result here, where a capture at issue would hide it.
// It also keeps each record to two pointers and a group, no payload. A WAR hazard on the destination
// (a slot refilled while another warp still reads it) is caught by neither choice: the refill lands
// even later than a synchronous copy would; only the barrier before the refill guards against it.
namespace sl_emu {

// "shared buffer 'As' at byte 48" (bounds mode registers the block's shared buffers) or the address.
inline std::string shared_place(const BlockCtx& b, const unsigned char* p) {
  for (int i = 0; i < b.nshared; ++i) {
    const Range& r = b.shared[i];
    if (r.lo <= p && p < r.lo + r.bytes)
      return "shared buffer '" + std::string(r.name) + "' at byte " + std::to_string(p - r.lo);
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "shared address %p", static_cast<const void*>(p));
  return buf;
}

// A thread may not exit with cp.async copies in flight: only its own wait_group can make them
// visible, so no thread was entitled to read that data, and a copy nobody may read is a missing
// wait (or dead work that still races with whatever reuses the shared memory). Pending empty
// groups are fine: the PTX ISA calls an empty cp.async-group trivially complete.
[[noreturn]] __attribute__((noinline, cold)) inline void cp_async_pending_at_exit(BlockCtx* b, Fiber* f) {
  size_t uncommitted = 0;
  for (const CpAsync& c : f->cp_pending) uncommitted += c.group == f->cp_commits;
  const size_t n = f->cp_pending.size(), committed = n - uncommitted;
  std::string what;
  if (committed) what += std::to_string(committed) + " in committed groups never waited for";
  if (uncommitted) what += std::string(committed ? ", " : "") + std::to_string(uncommitted) + " never committed";
  fail_thread(b, f, "exits with " + std::to_string(n) + " cp.async cop" + (n == 1 ? "y" : "ies") +
                       " still pending (" + what + "; oldest: 16 bytes into " +
                       shared_place(*b, f->cp_pending.front().dst) +
                       "): every cp.async must be committed (sl_cp_async_commit) and waited for "
                       "(sl_cp_async_wait<N>) before the thread exits; on the GPU these copies were never "
                       "made visible to any thread");
}

// A correct kernel has at most one copy in flight per 16 bytes of shared memory (PTX: copies that
// are not ordered by a wait, same group or not, to one location are undefined), and the GPU has at
// most 227 KiB of it; more pending copies is a bug, and the cap keeps the queue bounded.
constexpr size_t kMaxCpAsyncPending = 232448 / 16;

inline void cp_async_issue(void* smem_dst, const void* gmem_src, const void* site) {
  check_align(smem_dst, 16, "sl_cp_async_16", ": shared destination");
  check_align(gmem_src, 16, "sl_cp_async_16", ": global source");
  const char* buffer = bank_forget(smem_dst);
#ifdef SL_EMU_BOUNDS
  check_bytes(gmem_src, 16, false, "sl_cp_async_16 source");
  check_bytes(smem_dst, 16, true, "sl_cp_async_16 destination");
#endif
#ifdef SL_EMU_BANKS
  bank_note(site, smem_dst, 16, buffer ? buffer : "shared", "cp.async store");
#endif
  Fiber* f = sl_emu_tls_fiber;
  if (__builtin_expect(f->cp_pending.size() >= kMaxCpAsyncPending, 0))
    fail("sl_cp_async_16: " + std::to_string(f->cp_pending.size()) + " copies of this thread are already in flight, "
         "as many as there are 16-byte chunks in 227 KiB of shared memory: some destination is written twice "
         "without a sl_cp_async_wait in between (unordered on the GPU), or the kernel never waits");
  f->cp_pending.push_back(CpAsync{static_cast<unsigned char*>(smem_dst), static_cast<const unsigned char*>(gmem_src),
                                  f->cp_commits});
}

// Perform, in issue order, every pending copy of the groups before `group` (all older groups).
inline void cp_async_complete_before(Fiber* f, unsigned long long group) {
  std::vector<CpAsync>& q = f->cp_pending;
  size_t n = 0;
  for (; n < q.size() && q[n].group < group; ++n) std::memcpy(q[n].dst, q[n].src, 16);
  if (n) q.erase(q.begin(), q.begin() + static_cast<ptrdiff_t>(n));
}

}  // namespace sl_emu

SL_EMU_SITE_FN inline void sl_cp_async_16(void* smem_dst, const void* gmem_src) {
  ::sl_emu::cp_async_issue(smem_dst, gmem_src, SL_EMU_SITE);
}
inline void sl_cp_async_commit() { ++sl_emu_tls_fiber->cp_commits; }
// Complete all committed groups but the newest N (copies not yet committed stay pending).
template <int N>
inline void sl_cp_async_wait() {
  static_assert(N >= 0, "cp.async.wait_group takes a non-negative constant");
  ::sl_emu::Fiber* f = sl_emu_tls_fiber;
  if (f->cp_commits > static_cast<unsigned long long>(N))
    ::sl_emu::cp_async_complete_before(f, f->cp_commits - static_cast<unsigned long long>(N));
}

inline void __trap() { ::sl_emu::fail("__trap() called"); }
