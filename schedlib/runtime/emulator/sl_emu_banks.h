// schedlib CUDA emulator: the shared-memory bank census (built with SL_EMU_BANKS, on top of SL_EMU_BOUNDS).
//
// Shared memory serves a warp's request in wavefronts: 32 banks of 4 bytes, one word per bank per
// wavefront, the same word read by several lanes costs nothing extra (broadcast). A request of 8- or
// 16-byte accesses is served in phases of 16 or 8 lanes, each at least one wavefront. So a request
// costs, per phase, the largest number of distinct words any one bank holds; its ideal is one
// wavefront per phase. ldmatrix gives 16-byte rows from lanes 8i..8i+7 per matrix i, which is the
// same rule.
//
// Emulated threads do not run in lockstep, so a warp's request is rebuilt afterwards: every shared
// access is logged with its call site in the kernel (a return address) and the number of times this
// thread has executed that site before. The n-th execution of one site by the lanes of one warp is one
// request; lanes that skipped it (a guard) are inactive in it, as on the GPU. The log is folded into
// per-site totals at every block barrier and when the block ends. An address taken only to hand it to ldmatrix,
// cp.async, an mbarrier or TMA (`&tile[i]`) is dropped again by that wrapper (bank_forget), so it
// does not count as a load.
#pragma once
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "sl_emu_fiber.h"

namespace sl_emu {

struct BankAccess {
  const void* site;
  unsigned occurrence;  // how many times this thread executed the site before
  unsigned bytes;
  uintptr_t addr;
  const char* buffer;
  const char* op;
};

struct SiteTotals {
  std::string kernel, buffer, op;
  unsigned bytes = 0;
  unsigned long long requests = 0, wavefronts = 0, ideal = 0;

  void absorb(const SiteTotals& o) {  // the first part names the site
    if (!requests) {
      kernel = o.kernel;
      buffer = o.buffer;
      op = o.op;
      bytes = o.bytes;
    }
    requests += o.requests;
    wavefronts += o.wavefronts;
    ideal += o.ideal;
  }
};

struct BankCensus {
  std::mutex mu;
  std::map<const void*, SiteTotals> sites;
  std::atomic<long long> max_blocks{0};  // blocks emulated per launch; <= 0: all of them
};

inline BankCensus& bank_census() {
  static BankCensus census;
  return census;
}

// The running block's log, one entry list per thread (an OS thread runs one block at a time).
struct BankLog {
  std::vector<std::vector<BankAccess>> accesses;
  std::vector<std::unordered_map<const void*, unsigned>> seen;
};

inline BankLog& bank_log() {
  static thread_local BankLog log;
  return log;
}

inline void bank_note(const void* site, const void* addr, size_t bytes, const char* buffer, const char* op) {
  const BlockCtx* b = sl_emu_tls_block;
  const Fiber* f = sl_emu_tls_fiber;
  if (!b || !f) return;
  BankLog& log = bank_log();
  if (log.accesses.size() < static_cast<size_t>(b->nthreads)) {
    log.accesses.resize(static_cast<size_t>(b->nthreads));
    log.seen.resize(static_cast<size_t>(b->nthreads));
  }
  const unsigned n = log.seen[f->linear][site]++;
  log.accesses[f->linear].push_back(
      BankAccess{site, n, static_cast<unsigned>(bytes), reinterpret_cast<uintptr_t>(addr), buffer, op});
}

// Drop this thread's most recent logged access at `addr`: its address was only taken, not loaded.
// Returns that access's buffer name (nullptr if there was none), for the wrapper's own entry.
inline const char* bank_forget(const void* addr) {
  const Fiber* f = sl_emu_tls_fiber;
  BankLog& log = bank_log();
  if (!f || static_cast<size_t>(f->linear) >= log.accesses.size()) return nullptr;
  std::vector<BankAccess>& mine = log.accesses[f->linear];
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  for (size_t back = 0; back < 4 && back < mine.size(); ++back) {
    const size_t i = mine.size() - 1 - back;
    if (mine[i].addr == a) {
      const char* buffer = mine[i].buffer;
      --log.seen[f->linear][mine[i].site];
      mine.erase(mine.begin() + static_cast<ptrdiff_t>(i));
      return buffer;
    }
  }
  return nullptr;
}

// Wavefronts of one warp request: per phase, the most distinct words that fall into one bank.
inline void bank_cost(const std::vector<std::pair<int, const BankAccess*>>& lanes, unsigned long long& wavefronts,
                      unsigned long long& ideal) {
  const unsigned bytes = lanes.front().second->bytes;
  const int per_phase = bytes >= 8 ? static_cast<int>(128 / bytes) : 32;
  for (int phase = 0; phase < 32 / per_phase; ++phase) {
    std::vector<uintptr_t> words[32];
    bool active = false;
    for (const auto& [lane, a] : lanes) {
      if (lane / per_phase != phase) continue;
      active = true;
      for (uintptr_t w = a->addr / 4; w <= (a->addr + a->bytes - 1) / 4; ++w) words[w % 32].push_back(w);
    }
    if (!active) continue;
    size_t worst = 1;
    for (auto& bank : words) {
      std::sort(bank.begin(), bank.end());
      worst = std::max(worst, static_cast<size_t>(std::unique(bank.begin(), bank.end()) - bank.begin()));
    }
    wavefronts += worst;
    ideal += 1;
  }
}

// Fold the log into the per-site totals and clear it: at each block barrier (every thread has made the
// accesses before it, so those requests are whole) and when the block ends, which also restarts the
// per-site execution counts for the next block.
inline void bank_fold(const BlockCtx* b, bool block_end) {
  BankLog& log = bank_log();
  struct Key {
    int warp;
    const void* site;
    unsigned occurrence;
    bool operator<(const Key& o) const {
      if (warp != o.warp) return warp < o.warp;
      if (site != o.site) return site < o.site;
      return occurrence < o.occurrence;
    }
  };
  std::map<Key, std::vector<std::pair<int, const BankAccess*>>> requests;
  for (size_t t = 0; t < log.accesses.size() && t < static_cast<size_t>(b->nthreads); ++t) {
    const Fiber& f = b->fibers[t];
    for (const BankAccess& a : log.accesses[t]) requests[Key{f.warp, a.site, a.occurrence}].emplace_back(f.lane, &a);
  }
  std::map<const void*, SiteTotals> block;
  for (const auto& [key, lanes] : requests) {
    const BankAccess& first = *lanes.front().second;
    SiteTotals one{b->kernel, first.buffer, first.op, first.bytes, 1, 0, 0};
    bank_cost(lanes, one.wavefronts, one.ideal);
    block[key.site].absorb(one);
  }
  for (auto& v : log.accesses) v.clear();
  if (block_end)
    for (auto& m : log.seen) m.clear();
  BankCensus& census = bank_census();
  std::lock_guard<std::mutex> lock(census.mu);
  for (const auto& [site, s] : block) census.sites[site].absorb(s);
}

inline void banks_reset(long long max_blocks) {
  BankCensus& census = bank_census();
  std::lock_guard<std::mutex> lock(census.mu);
  census.sites.clear();
  census.max_blocks.store(max_blocks);
}

// One tab-separated line per site: library offset of the call site, kernel, buffer, operation, bytes per
// lane, requests, wavefronts, ideal wavefronts. Returns the length of the whole report (it is cut to fit).
inline long long banks_report(char* out, unsigned long long capacity) {
  BankCensus& census = bank_census();
  std::lock_guard<std::mutex> lock(census.mu);
  std::string text;
  for (const auto& [site, s] : census.sites) {
    Dl_info info{};
    const uintptr_t base = dladdr(site, &info) ? reinterpret_cast<uintptr_t>(info.dli_fbase) : 0;
    char line[96];
    std::snprintf(line, sizeof line, "%llx\t", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(site) - base));
    text += line + s.kernel + "\t" + s.buffer + "\t" + s.op + "\t" + std::to_string(s.bytes) + "\t" +
            std::to_string(s.requests) + "\t" + std::to_string(s.wavefronts) + "\t" + std::to_string(s.ideal) + "\n";
  }
  if (out && capacity) std::snprintf(out, static_cast<size_t>(capacity), "%s", text.c_str());
  return static_cast<long long>(text.size());
}

}  // namespace sl_emu
