// schedlib CUDA emulator: the C ABI of a launch, parameter checking, and the grid runner.
//
// The Python side generates, after the kernel source, one wrapper per launched kernel:
//   extern "C" int sl_emu_launch__<kernel>(const sl_emu_launch_t*, char* err, unsigned long long errlen)
//   { return sl_emu::launch(&<kernel>, "<kernel>", L, err, errlen); }
// launch() reads the kernel's parameter types from its function pointer, checks every argument
// against them (pointer vs scalar, element dtype, const-ness for read-only arrays), then runs the
// grid: blocks are handed out by an atomic counter to a pool of OS threads, each running one block
// at a time as fibers. The first error stops the launch and comes back as the message in `err`.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "sl_emu_warp.h"
#include "sl_emu_tma.h"
#include "sl_emu_wgmma.h"
#ifdef SL_EMU_BANKS
#include "sl_emu_banks.h"
#endif

#define SL_EMU_ABI_VERSION 1

extern "C" {
// One launch, filled by the Python side (schedlib/runtime/emulator/abi.py mirrors this layout).
typedef struct sl_emu_launch_t {
  unsigned int grid[3];
  unsigned int block[3];
  unsigned long long dyn_smem;  // bytes of dynamic shared memory
  int threads;                  // OS threads; <= 0: all cores
  int stack_kb;                 // fiber stack size; <= 0: 128
  int nargs;
  const char* const* names;     // argument names, for messages
  const int* kinds;             // 0 pointer, 1 integer, 2 float (per argument)
  const char* const* dtypes;    // numpy dtype name of each pointer argument
  void* const* ptrs;            // data pointer of each pointer argument
  const unsigned long long* nbytes;  // byte size of each pointer argument
  const int* readonly;          // 1 if the array must not be written
  const long long* ivals;       // value of each integer argument
  const double* fvals;          // value of each float argument
} sl_emu_launch_t;
}

namespace sl_emu {

enum ArgKind { kArgPtr = 0, kArgInt = 1, kArgFloat = 2 };

template <class T> struct Elem { static constexpr const char* name = nullptr; };
#define SL_EMU_ELEM(T, N) template <> struct Elem<T> { static constexpr const char* name = N; };
SL_EMU_ELEM(void, "any")
SL_EMU_ELEM(float, "float32") SL_EMU_ELEM(float2, "float32") SL_EMU_ELEM(float3, "float32") SL_EMU_ELEM(float4, "float32")
SL_EMU_ELEM(double, "float64") SL_EMU_ELEM(double2, "float64")
SL_EMU_ELEM(__half, "float16") SL_EMU_ELEM(__half2, "float16")
SL_EMU_ELEM(__nv_bfloat16, "bfloat16") SL_EMU_ELEM(__nv_bfloat162, "bfloat16")
SL_EMU_ELEM(int, "int32") SL_EMU_ELEM(int2, "int32") SL_EMU_ELEM(int3, "int32") SL_EMU_ELEM(int4, "int32")
SL_EMU_ELEM(unsigned int, "uint32") SL_EMU_ELEM(uint2, "uint32") SL_EMU_ELEM(uint3, "uint32") SL_EMU_ELEM(uint4, "uint32")
SL_EMU_ELEM(short, "int16") SL_EMU_ELEM(short2, "int16") SL_EMU_ELEM(short4, "int16")
SL_EMU_ELEM(unsigned short, "uint16") SL_EMU_ELEM(ushort2, "uint16") SL_EMU_ELEM(ushort4, "uint16")
SL_EMU_ELEM(signed char, "int8") SL_EMU_ELEM(char2, "int8") SL_EMU_ELEM(char4, "int8") SL_EMU_ELEM(char, "char")
SL_EMU_ELEM(unsigned char, "uint8") SL_EMU_ELEM(uchar2, "uint8") SL_EMU_ELEM(uchar4, "uint8")
SL_EMU_ELEM(long, "int64") SL_EMU_ELEM(long long, "int64") SL_EMU_ELEM(longlong2, "int64")
SL_EMU_ELEM(unsigned long, "uint64") SL_EMU_ELEM(unsigned long long, "uint64") SL_EMU_ELEM(bool, "bool")
#undef SL_EMU_ELEM

// Does a numpy array of dtype `np` fit a kernel pointer to `want`? uint16 arrays carry bf16 bits.
inline bool dtype_ok(const char* want, const char* np) {
  auto eq = [](const char* a, const char* b) { return std::strcmp(a, b) == 0; };
  if (eq(want, "any") || eq(want, np)) return true;
  if (eq(want, "bfloat16")) return eq(np, "uint16");
  if (eq(want, "uint16")) return eq(np, "bfloat16");
  if (eq(want, "char")) return eq(np, "int8") || eq(np, "uint8");
  return false;
}

inline std::string got_str(const sl_emu_launch_t& L, int i) {
  if (L.kinds[i] == kArgPtr) return std::string("a ") + L.dtypes[i] + " array";
  return L.kinds[i] == kArgInt ? "a Python int" : "a Python float";
}

template <class T>
inline bool check_pointer(const sl_emu_launch_t& L, int i, std::string& err) {
  using E = std::remove_cv_t<T>;
  const char* want = Elem<E>::name;
  const std::string what = want ? std::string("a pointer to ") + want : "a pointer";
  if (L.kinds[i] != kArgPtr) { err = "the kernel expects " + what + " but got " + got_str(L, i); return false; }
  if (want ? !dtype_ok(want, L.dtypes[i]) : L.nbytes[i] % sizeof(E) != 0) {
    err = "the kernel expects " + what + " but got " + got_str(L, i);
    return false;
  }
  if (!std::is_const<T>::value && L.readonly[i]) {
    err = "the array is read-only but the kernel parameter is a non-const pointer "
          "(declare it SL_GLOBAL(const T) or pass a writable array)";
    return false;
  }
  return true;
}

template <class P, class Enable = void>
struct Param {
  static bool convert(const sl_emu_launch_t&, int, P&, std::string& err) {
    err = "the emulator cannot pass a parameter of this C++ type (only pointers, integers, float and double)";
    return false;
  }
};

template <class T>
struct Param<T*, void> {
  static bool convert(const sl_emu_launch_t& L, int i, T*& out, std::string& err) {
    if (!check_pointer<T>(L, i, err)) return false;
    out = static_cast<T*>(L.ptrs[i]);
    return true;
  }
};

template <class T>
struct Param<Ptr<T>, void> {
  static bool convert(const sl_emu_launch_t& L, int i, Ptr<T>& out, std::string& err) {
    if (!check_pointer<T>(L, i, err)) return false;
    using E = std::conditional_t<std::is_void<std::remove_cv_t<T>>::value, unsigned char, std::remove_cv_t<T>>;
    out = Ptr<T>(static_cast<T*>(L.ptrs[i]), L.nbytes[i] / sizeof(E), L.names[i], "global");
    return true;
  }
};

template <class T>
struct Param<T, std::enable_if_t<std::is_integral<T>::value>> {
  static bool convert(const sl_emu_launch_t& L, int i, T& out, std::string& err) {
    const char* want = Elem<T>::name ? Elem<T>::name : "an integer";
    if (L.kinds[i] != kArgInt) { err = std::string("the kernel expects ") + want + " but got " + got_str(L, i); return false; }
    const long long v = L.ivals[i];
    const bool fits = std::is_signed<T>::value
        ? v >= static_cast<long long>(std::numeric_limits<T>::min()) && v <= static_cast<long long>(std::numeric_limits<T>::max())
        : v >= 0 && static_cast<unsigned long long>(v) <= static_cast<unsigned long long>(std::numeric_limits<T>::max());
    if (!fits) { err = "the value " + std::to_string(v) + " does not fit the kernel's " + want; return false; }
    out = static_cast<T>(v);
    return true;
  }
};

template <class T>
struct Param<T, std::enable_if_t<std::is_floating_point<T>::value>> {
  static bool convert(const sl_emu_launch_t& L, int i, T& out, std::string& err) {
    if (L.kinds[i] != kArgFloat) { err = std::string("the kernel expects ") + Elem<T>::name + " but got " + got_str(L, i); return false; }
    out = static_cast<T>(L.fvals[i]);
    return true;
  }
};

template <class... P>
struct Payload {
  void (*fn)(P...);
  std::tuple<P...> args;
  static void invoke(const void* p) {
    const auto* pl = static_cast<const Payload*>(p);
    std::apply(pl->fn, pl->args);
  }
};

template <class Tuple, size_t... I>
inline bool convert_args(const sl_emu_launch_t& L, Tuple& t, std::string& err, std::index_sequence<I...>) {
  int bad = -1;
  std::string why;
  auto one = [&](auto& slot, int i) {
    using P = std::remove_reference_t<decltype(slot)>;
    if (bad < 0 && !Param<P>::convert(L, i, slot, why)) bad = i;
  };
  (one(std::get<I>(t), static_cast<int>(I)), ...);
  if (bad < 0) return true;
  err = "parameter " + std::to_string(bad) + " ('" + L.names[bad] + "'): " + why;
  return false;
}

struct Grid {
  const char* kernel;
  void (*invoke)(const void*);
  const void* payload;
  dim3 grid, block;
  size_t dyn_bytes, stack_bytes;
  long long nblocks;
  std::vector<Range> globals;
  std::atomic<long long> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string error;

  void record(const std::string& msg) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed.load()) error = msg;
    failed.store(true);
  }
};

// Fiber stacks of one worker, reused by every block it runs. Below each stack lies an untouched
// gap of the same size (address space only, never backed by memory), so an overflow of up to one
// stack size lands there instead of in a neighbour's live frames; the overwritten canary is then
// reported when the fiber exits. A guard page sits below everything. The stride is not a power
// of two (one page + one cache line extra) so that the stack tops, touched at every context
// switch, fall into different cache sets instead of evicting each other.
struct Stacks {
  unsigned char* map = nullptr;
  size_t map_bytes = 0, first = 0, stride = 0;
  Stacks(int n, size_t stack_bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    stride = 2 * stack_bytes + 4096 + 64;
    first = page + stride - stack_bytes;
    map_bytes = first + static_cast<size_t>(n) * stride;
    void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    map = static_cast<unsigned char*>(m);
    mprotect(map, page, PROT_NONE);
  }
  ~Stacks() { munmap(map, map_bytes); }
  unsigned char* base() const { return map + first; }
};

inline void run_worker(Grid* g) {
  try {
    const int n = static_cast<int>(g->block.x * g->block.y * g->block.z);
    const int nwarps = (n + 31) / 32;
    unsigned cap = 1;
    while (cap < static_cast<unsigned>(n)) cap <<= 1;
    std::vector<Fiber> fibers(static_cast<size_t>(n));
    std::unique_ptr<Warp[]> warps(new Warp[static_cast<size_t>(nwarps)]);
    std::vector<int> queue(cap);
    Stacks stacks(n, g->stack_bytes);
    std::unique_ptr<unsigned char[]> dyn(new (std::align_val_t(128)) unsigned char[g->dyn_bytes + 16]);
    BlockCtx b;
    b.kernel = g->kernel;
    b.invoke = g->invoke;
    b.payload = g->payload;
    b.blockDim = g->block;
    b.gridDim = g->grid;
    b.nthreads = n;
    b.nwarps = nwarps;
    b.fibers = fibers.data();
    b.warps = warps.get();
    b.queue = queue.data();
    b.qmask = cap - 1;
    b.dyn_smem = dyn.get();
    b.dyn_bytes = g->dyn_bytes;
    b.globals = g->globals.data();
    b.nglobals = static_cast<int>(g->globals.size());
    sl_emu_tls_block = &b;
    const long long gx = g->grid.x, gxy = static_cast<long long>(g->grid.x) * g->grid.y;
    while (!g->failed.load(std::memory_order_relaxed)) {
      const long long id = g->next.fetch_add(1);
      if (id >= g->nblocks) break;
      b.blockIdx = {static_cast<unsigned>(id % gx), static_cast<unsigned>((id / gx) % g->grid.y),
                    static_cast<unsigned>(id / gxy)};
#ifdef SL_EMU_BOUNDS
      std::memset(b.dyn_smem, 0xff, b.dyn_bytes);  // NaN-filled: reads before writes show up
      b.nshared = 0;
      register_shared(b.dyn_smem, b.dyn_bytes, "dynamic shared memory", false);
#endif
      run_block(&b, stacks.base(), stacks.stride, g->stack_bytes);
      if (b.failed) { g->record(b.error); break; }
#ifdef SL_EMU_BANKS
      bank_fold(&b, true);
#endif
    }
    sl_emu_tls_block = nullptr;
  } catch (const std::exception& e) {
    sl_emu_tls_block = nullptr;
    g->record(std::string("kernel '") + g->kernel + "': emulator out of resources: " + e.what());
  }
}

inline std::string check_dims(const sl_emu_launch_t& L) {
  const unsigned* gd = L.grid;
  const unsigned* bd = L.block;
  const unsigned long long nt = 1ull * bd[0] * bd[1] * bd[2];
  if (!gd[0] || !gd[1] || !gd[2] || !bd[0] || !bd[1] || !bd[2]) return "grid and block dimensions must be >= 1";
  if (bd[0] > 1024 || bd[1] > 1024 || bd[2] > 64 || nt > 1024)
    return "block (" + std::to_string(bd[0]) + "," + std::to_string(bd[1]) + "," + std::to_string(bd[2]) +
           ") exceeds the CUDA limits (x,y <= 1024, z <= 64, at most 1024 threads)";
  if (gd[0] > 2147483647u || gd[1] > 65535u || gd[2] > 65535u) return "grid exceeds the CUDA limits (y, z <= 65535)";
  if (L.dyn_smem > 232448ull) return "dynamic shared memory " + std::to_string(L.dyn_smem) + " B exceeds 227 KiB";
  return "";
}

inline int finish(const std::string& msg, char* err, unsigned long long errlen) {
  if (msg.empty()) return 0;
  if (err && errlen) std::snprintf(err, static_cast<size_t>(errlen), "%s", msg.c_str());
  return 1;
}

template <class... P>
inline int launch(void (*fn)(P...), const char* kernel, const sl_emu_launch_t* L, char* err, unsigned long long errlen) {
  const std::string where = std::string("kernel '") + kernel + "': ";
  if (L->nargs != static_cast<int>(sizeof...(P))) {
    std::string given;
    for (int i = 0; i < L->nargs; ++i) given += (i ? ", " : "") + std::string(L->names[i]);
    return finish(where + "takes " + std::to_string(sizeof...(P)) + " parameters but the launch passes " +
                      std::to_string(L->nargs) + " (" + given + ")", err, errlen);
  }
  Payload<P...> payload{fn, {}};
  std::string msg;
  if (!convert_args(*L, payload.args, msg, std::index_sequence_for<P...>{})) return finish(where + msg, err, errlen);
  msg = check_dims(*L);
  if (!msg.empty()) return finish(where + msg, err, errlen);

  Grid g;
  g.kernel = kernel;
  g.invoke = &Payload<P...>::invoke;
  g.payload = &payload;
  g.grid = dim3(L->grid[0], L->grid[1], L->grid[2]);
  g.block = dim3(L->block[0], L->block[1], L->block[2]);
  g.dyn_bytes = static_cast<size_t>(L->dyn_smem);
  const size_t kb = L->stack_kb > 0 ? static_cast<size_t>(L->stack_kb) : 128;
  g.stack_bytes = ((kb < 16 ? 16 : kb) * 1024 + 4095) & ~static_cast<size_t>(4095);
  g.nblocks = 1ll * L->grid[0] * L->grid[1] * L->grid[2];
#ifdef SL_EMU_BANKS
  const long long sample = bank_census().max_blocks.load();  // the census may look at the first blocks only
  if (sample > 0 && sample < g.nblocks) g.nblocks = sample;
#endif
  for (int i = 0; i < L->nargs; ++i)
    if (L->kinds[i] == kArgPtr)
      g.globals.push_back(Range{static_cast<const unsigned char*>(L->ptrs[i]), static_cast<size_t>(L->nbytes[i]), L->names[i]});

  long long nthreads = L->threads > 0 ? L->threads : static_cast<long long>(std::thread::hardware_concurrency());
  if (nthreads < 1) nthreads = 1;
  if (nthreads > g.nblocks) nthreads = g.nblocks;
  std::vector<std::thread> pool;
  try {
    for (long long t = 1; t < nthreads; ++t) pool.emplace_back(run_worker, &g);
  } catch (const std::exception&) {
    // Fewer OS threads than asked for: the ones that started (and this one) do all the blocks.
  }
  run_worker(&g);
  for (auto& t : pool) t.join();
  return finish(g.failed.load() ? g.error : std::string(), err, errlen);
}

}  // namespace sl_emu
