// schedlib CUDA emulator: Hopper transaction barriers (mbarrier) and TMA tensor copies.
//
// mbarrier: a 64-bit object in shared memory that completes a *phase* when its expected arrivals
// have arrived and every byte announced with expect_tx has landed (tx count back to zero); then it
// flips its phase parity and rearms. A thread waits for "the phase of parity p has completed",
// i.e. until the current phase's parity differs from p. The emulator keeps the whole state in the
// object itself (arrivals left 16 bits, arrival count 16 bits, parity 1 bit, tx count signed 31
// bits), so a barrier is as private to its block as on the GPU. A waiting thread leaves the CPU to
// the others until a completion releases it; if nobody can, that is reported as a deadlock.
//
// TMA: cp.async.bulk.tensor copies a box of a tensor described by a tensor map into shared memory,
// filling elements outside the tensor with zeros, swizzling 16-byte chunks on the destination's
// address bits exactly as wgmma's canonical layouts expect (bits [4, 4+b) ^= bits [7, 7+b), b =
// log2(W/16) for a W-byte swizzle), and counts the box's bytes against an mbarrier. On the GPU the
// tensor map is the driver's opaque 128-byte object; the emulator reads its own 128-byte layout
// (built by schedlib/runtime/emulator/abi.py, words below). The copy lands when it is issued: a
// pending wgmma still reading the slot (sl_emu_wgmma.h performs wgmmas at their wait) then sees the
// new data, so a ring refilled too early fails here as it would, intermittently, on the GPU.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "sl_emu_wgmma.h"

namespace sl_emu {

// Tensor map words: magic, base, rank | elem_bytes << 8 | swizzle_bytes << 16, dims[3] (innermost
// first), strides[2] (bytes of dims 1 and 2), box0 | box1 << 16 | box2 << 32.
constexpr uint64_t kTensorMapMagic = 0x3130504D544C53ull;  // "SLTMP01"
enum : int { kTmMagic = 0, kTmBase = 1, kTmFormat = 2, kTmDims = 3, kTmStrides = 6, kTmBox = 8 };

struct MbarState {
  unsigned left, count, parity;
  long long tx;
};

inline MbarState mbar_load(const uint64_t* bar) {
  const uint64_t v = *bar;
  long long tx = static_cast<long long>((v >> 33) & 0x7FFFFFFFull);
  if (tx & (1ll << 30)) tx -= 1ll << 31;  // sign-extend 31 bits
  return MbarState{static_cast<unsigned>(v & 0xFFFF), static_cast<unsigned>((v >> 16) & 0xFFFF),
                   static_cast<unsigned>((v >> 32) & 1), tx};
}

inline void mbar_store(uint64_t* bar, const MbarState& s) {
  *bar = (static_cast<uint64_t>(s.left) & 0xFFFF) | ((static_cast<uint64_t>(s.count) & 0xFFFF) << 16) |
         (static_cast<uint64_t>(s.parity & 1) << 32) | ((static_cast<uint64_t>(s.tx) & 0x7FFFFFFFull) << 33);
}

// Complete the phase if nothing is outstanding: flip the parity, rearm, release its waiters.
inline void mbar_settle(uint64_t* bar, MbarState s) {
  if (s.left == 0 && s.tx == 0) {
    s.parity ^= 1u;
    s.left = s.count;
    BlockCtx* b = sl_emu_tls_block;
    for (int k = 0; k < b->nthreads; ++k) {
      const int i = nth_in_order(b, b->nthreads, k);
      Fiber& f = b->fibers[i];
      if (f.state == kWaitMbarrier && f.mbarrier == bar) {
        f.mbarrier = nullptr;
        push_ready(b, i);
      }
    }
  }
  mbar_store(bar, s);
}

inline MbarState mbar_checked(const uint64_t* bar, const char* op) {
  const MbarState s = mbar_load(bar);
  if (s.count == 0)
    fail(std::string(op) + ": the mbarrier was never initialised (sl_mbar_init with an arrival count >= 1)");
  return s;
}

inline void mbar_complete_tx(uint64_t* bar, long long bytes, const char* op) {
  MbarState s = mbar_checked(bar, op);
  s.tx -= bytes;
  mbar_settle(bar, s);
}

inline void tma_load_3d(void* dst, const uint64_t* tm, int c0, int c1, int c2, uint64_t* bar) {
  if (tm[kTmMagic] != kTensorMapMagic)
    fail("sl_tma_load_3d: the tensor map argument is not one schedlib built (wrong parameter?)");
  const int elem = static_cast<int>((tm[kTmFormat] >> 8) & 0xFF);
  const int swz = static_cast<int>((tm[kTmFormat] >> 16) & 0xFFFF);
  const long long dims[3] = {static_cast<long long>(tm[kTmDims]), static_cast<long long>(tm[kTmDims + 1]),
                             static_cast<long long>(tm[kTmDims + 2])};
  const int box[3] = {static_cast<int>(tm[kTmBox] & 0xFFFF), static_cast<int>((tm[kTmBox] >> 16) & 0xFFFF),
                      static_cast<int>((tm[kTmBox] >> 32) & 0xFFFF)};
  const unsigned char* base = reinterpret_cast<const unsigned char*>(tm[kTmBase]);
  const unsigned start = smem_addr(dst);
  if (start % 128)
    fail("sl_tma_load_3d: the shared destination (address " + std::to_string(start) + ") is not 128-byte aligned");
  if (swz && box[0] * elem != swz)
    fail("sl_tma_load_3d: a " + std::to_string(swz) + "-byte swizzle needs boxes whose rows are exactly that wide, "
         "got " + std::to_string(box[0] * elem) + " bytes");
  const long long bytes = 1ll * box[0] * box[1] * box[2] * elem;
  const BlockCtx* b = sl_emu_tls_block;
  if (start + bytes > b->dyn_bytes)
    fail("sl_tma_load_3d: a box of " + std::to_string(bytes) + " bytes at shared address " + std::to_string(start) +
         " runs past the " + std::to_string(b->dyn_bytes) + " bytes of dynamic shared memory");
  const unsigned mask = swz == 128 ? 7u : swz == 64 ? 3u : swz == 32 ? 1u : 0u;
  for (int i2 = 0; i2 < box[2]; ++i2)
    for (int i1 = 0; i1 < box[1]; ++i1)
      for (int i0 = 0; i0 < box[0]; ++i0) {
        const long long g0 = c0 + i0, g1 = c1 + i1, g2 = c2 + i2;
        unsigned addr = start + static_cast<unsigned>(((i2 * box[1] + i1) * box[0] + i0) * elem);
        addr ^= ((addr >> 7) & mask) << 4;
        unsigned char* out = b->dyn_smem + addr;
        if (g0 < 0 || g1 < 0 || g2 < 0 || g0 >= dims[0] || g1 >= dims[1] || g2 >= dims[2]) {
          std::memset(out, 0, static_cast<size_t>(elem));
        } else {
          const long long off = g0 * elem + g1 * static_cast<long long>(tm[kTmStrides]) +
                                g2 * static_cast<long long>(tm[kTmStrides + 1]);
          std::memcpy(out, base + off, static_cast<size_t>(elem));
        }
      }
  mbar_complete_tx(bar, bytes, "sl_tma_load_3d");
}

}  // namespace sl_emu

inline void sl_mbar_init(unsigned long long* bar, unsigned count) {
  ::sl_emu::bank_forget(bar);  // mbarrier operations are not data loads
  if (count < 1 || count > 0xFFFF) ::sl_emu::fail("sl_mbar_init: arrival count " + std::to_string(count) +
                                                  " is outside 1..65535");
  ::sl_emu::mbar_store(reinterpret_cast<uint64_t*>(bar), ::sl_emu::MbarState{count, count, 0, 0});
}
inline void sl_mbar_init_fence() {}
// One arrival that also announces `bytes` more to land in the current phase.
inline void sl_mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  ::sl_emu::bank_forget(bar);  // mbarrier operations are not data loads
  uint64_t* p = reinterpret_cast<uint64_t*>(bar);
  ::sl_emu::MbarState s = ::sl_emu::mbar_checked(p, "sl_mbar_expect_tx");
  if (s.left == 0) ::sl_emu::fail("sl_mbar_expect_tx: more arrivals than the mbarrier's count in one phase");
  s.tx += bytes;
  --s.left;
  ::sl_emu::mbar_settle(p, s);
}
// One arrival without bytes (a consumer releasing a ring slot).
inline void sl_mbar_arrive(unsigned long long* bar) {
  ::sl_emu::bank_forget(bar);  // mbarrier operations are not data loads
  uint64_t* p = reinterpret_cast<uint64_t*>(bar);
  ::sl_emu::MbarState s = ::sl_emu::mbar_checked(p, "sl_mbar_arrive");
  if (s.left == 0) ::sl_emu::fail("sl_mbar_arrive: more arrivals than the mbarrier's count in one phase");
  --s.left;
  ::sl_emu::mbar_settle(p, s);
}
// Wait until the phase of parity `parity` has completed.
inline void sl_mbar_wait(unsigned long long* bar, unsigned parity) {
  ::sl_emu::bank_forget(bar);  // mbarrier operations are not data loads
  ::sl_emu::BlockCtx* b = sl_emu_tls_block;
  ::sl_emu::Fiber* f = sl_emu_tls_fiber;
  while (::sl_emu::mbar_checked(reinterpret_cast<uint64_t*>(bar), "sl_mbar_wait").parity == (parity & 1u)) {
    f->state = ::sl_emu::kWaitMbarrier;
    f->mbarrier = bar;
    ::sl_emu::wait_released(b, f);
  }
}
inline void sl_tmap_acquire(const unsigned long long* tmap) {
  if (reinterpret_cast<const uint64_t*>(tmap)[::sl_emu::kTmMagic] != ::sl_emu::kTensorMapMagic)
    ::sl_emu::fail("sl_tmap_acquire: the argument is not a tensor map schedlib built (wrong parameter?)");
}
inline void sl_tma_load_3d(void* dst, const unsigned long long* tmap, int c0, int c1, int c2,
                           unsigned long long* bar) {
  ::sl_emu::bank_forget(bar);
  ::sl_emu::bank_forget(dst);
  ::sl_emu::tma_load_3d(dst, reinterpret_cast<const uint64_t*>(tmap), c0, c1, c2, reinterpret_cast<uint64_t*>(bar));
}
