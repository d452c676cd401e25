// schedlib CUDA emulator: the state of a block being run: its threads (fibers) with their waits and
// asynchronous work in flight, its warps, its barriers, its shared memory and its register pool.  The
// running block and fiber of each OS thread are thread-locals.  sl_emu_fiber.h schedules the fibers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sl_emu_context.h"
#include "sl_emu_types.h"

namespace sl_emu {

enum FiberState : int {
  kReady = 0, kWaitBlock = 1, kWaitWarp = 2, kExited = 3, kWaitMbarrier = 4, kWaitNamed = 5, kWaitRegisters = 6
};
constexpr int kXSlot = 32;            // bytes per lane in a warp exchange
constexpr uint64_t kCanary = 0x5eed5eed5eed5eedull;

// One issued, not yet completed 16-byte cp.async (sl_emu_warp.h): neither end is touched until
// the sl_cp_async_wait that completes its group.
struct CpAsync {
  unsigned char* dst;
  const unsigned char* src;
  unsigned long long group;  // the thread's cp.async-group: number of commits before the issue
};

// One issued, not yet completed wgmma.mma_async (sl_emu_wgmma.h): neither the accumulators nor the
// shared-memory operands are touched until the sl_wgmma_wait that completes its group.
struct WgmmaOp {
  float* d;
  uint64_t desc_a, desc_b;
  int n;               // the instruction's N (d holds n / 2 floats of this thread)
  bool trans_a, trans_b, bf16;
  unsigned long long group;  // the thread's wgmma-group: number of commits before the issue
};

struct Fiber {
  Ctx ctx;
  uint3 tid;
  int linear = 0, warp = 0, lane = 0;
  int state = kReady;
  uint64_t* canary = nullptr;  // lowest word of this fiber's stack
  // cp.async state of this CUDA thread: copies in issue order (so group order), and the number of
  // commits so far (= the open group). The vector is cleared, not freed, for each block, so its
  // capacity is reused; sl_cp_async_16 bounds its length.
  std::vector<CpAsync> cp_pending;
  unsigned long long cp_commits = 0;
  // wgmma state, kept the same way: operations in issue order and the commits so far.
  std::vector<WgmmaOp> wg_pending;
  unsigned long long wg_commits = 0;
  const void* mbarrier = nullptr;  // the mbarrier this thread waits on (state kWaitMbarrier)
  int named = 0;                   // the named barrier this thread waits at (state kWaitNamed)
};

struct Warp {
  int size = 0;          // lanes that exist (the last warp of a block may be partial)
  int arrivals = 0;
  unsigned phase = 0;    // completed warp barriers; selects the exchange buffer
  alignas(16) unsigned char xbuf[2][32][kXSlot];
};

// setmaxnreg's view of the block: each warpgroup's registers per thread, the CTA's pool, and the warpgroups
// meeting at (or waiting in) a setmaxnreg.
struct RegisterFile {
  long long pool = 0;
  int per_thread[8] = {};
  int arrivals[8] = {};
  int request[8] = {};  // the count of the setmaxnreg being met (negative: dec)
  int pending[8] = {};  // an inc granted when the pool holds it (0: none)
};

struct Range {
  const unsigned char* lo;
  size_t bytes;
  const char* name;
};

struct BlockCtx {
  const char* kernel = "";
  void (*invoke)(const void*) = nullptr;
  const void* payload = nullptr;
  uint3 blockIdx{0, 0, 0};
  dim3 blockDim, gridDim;
  int nthreads = 0, nwarps = 0;
  Fiber* fibers = nullptr;
  Warp* warps = nullptr;
  int* queue = nullptr;
  unsigned qmask = 0, qhead = 0, qtail = 0;
  int bar_arrivals = 0, exited = 0;
  unsigned bar_phase = 0;          // completed block barriers; selects bar_count
  int bar_count[2] = {0, 0};       // predicate sums of __syncthreads_count/_and/_or
  int named_threads[16] = {};      // threads waiting at each named barrier (sl_named_barrier)
  int named_warps[16] = {};        // 32 for each warp all of whose lanes that have not exited wait there
  int named_count[16] = {};        // the count those threads gave
  RegisterFile regs;               // setmaxnreg's register pool (sl_emu_wgmma.h)
  Ctx main;
  unsigned char* dyn_smem = nullptr;
  size_t dyn_bytes = 0;
  const Range* globals = nullptr;  // kernel pointer arguments (bounds mode: range checks)
  int nglobals = 0;
  Range shared[64];                // this block's shared buffers, registered as declared
  int nshared = 0;
  bool failed = false;
  bool ordered = false;            // checked runs: every release keeps the block's thread order
  bool reversed = false;           // that order is last-first (see run_block)
  std::string error;
};

}  // namespace sl_emu

// The running block and fiber of this OS thread. External linkage on purpose: every call to the
// out-of-line context switch must be assumed to change them, so the compiler reloads after it.
#define SL_EMU_TLS __attribute__((visibility("hidden"), tls_model("local-dynamic"))) thread_local
extern "C" {
SL_EMU_TLS sl_emu::BlockCtx* sl_emu_tls_block = nullptr;
SL_EMU_TLS sl_emu::Fiber* sl_emu_tls_fiber = nullptr;
}
#undef SL_EMU_TLS
