// schedlib CUDA emulator: global/shared memory as seen by a kernel, checked or raw.
//
// Normal mode keeps SL_GLOBAL/SL_SHARED raw pointers and arrays so emulated kernels run at native
// speed. With SL_EMU_BOUNDS they become sl_emu::Ptr<T>, a pointer that remembers its buffer's name
// and extent and checks every dereference, so an out-of-range access is reported with kernel,
// buffer, index, size, block and thread instead of silently corrupting memory. Vector accesses
// (SL_VLOAD/SL_VSTORE) check their full width and, in both modes, the alignment the GPU requires.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "sl_emu_fiber.h"

// The bank census (SL_EMU_BANKS, sl_emu_banks.h) keys every shared-memory access by the call site in the
// kernel: the accessors kernels call directly are then out-of-line, and pass their return address on.
#ifdef SL_EMU_BANKS
#define SL_EMU_SITE_FN __attribute__((noinline))
#define SL_EMU_SITE __builtin_return_address(0)
#else
#define SL_EMU_SITE_FN
#define SL_EMU_SITE nullptr
#endif

namespace sl_emu {

#ifdef SL_EMU_BANKS
inline void bank_note(const void* site, const void* addr, size_t bytes, const char* buffer, const char* op);
inline const char* bank_forget(const void* addr);
#else
inline const char* bank_forget(const void*) { return nullptr; }
#endif

inline std::string hexaddr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// Check that the byte range [p, p + bytes) lies inside one known global or shared buffer
// (used for cp.async and ldmatrix, whose operands are untyped addresses).
inline void check_bytes(const void* p, size_t bytes, bool shared, const char* op) {
  const BlockCtx* b = sl_emu_tls_block;
  const Range* rs = shared ? b->shared : b->globals;
  const int n = shared ? b->nshared : b->nglobals;
  const auto* c = static_cast<const unsigned char*>(p);
  const Range* best = nullptr;  // the buffer starting closest below p
  for (int i = 0; i < n; ++i)
    if (rs[i].lo <= c && (!best || rs[i].lo > best->lo)) best = &rs[i];
  const char* space = shared ? "shared" : "global";
  if (best && c + bytes <= best->lo + best->bytes) return;
  if (best && c < best->lo + best->bytes + 4096)
    fail(std::string(op) + ": bytes [" + std::to_string(c - best->lo) + ", " +
         std::to_string(c - best->lo + bytes) + ") of " + space + " buffer '" + best->name +
         "' are out of bounds (size " + std::to_string(best->bytes) + " bytes)");
  fail(std::string(op) + ": address " + hexaddr(p) + " is not inside any " + space + " buffer");
}

// Record a shared buffer of the running block (first declaration wins). A static SL_SHARED array
// is also filled with 0xff bytes (NaN as float) for each block, like the dynamic shared memory,
// so reading shared data no thread of the block wrote shows up instead of reusing a stale block's.
inline void register_shared(void* lo, size_t bytes, const char* name, bool poison) {
  BlockCtx* b = sl_emu_tls_block;
  const auto* c = static_cast<const unsigned char*>(lo);
  for (int i = 0; i < b->nshared; ++i)
    if (b->shared[i].lo == c) return;
  if (poison) std::memset(lo, 0xff, bytes);
  if (b->nshared < static_cast<int>(sizeof b->shared / sizeof b->shared[0]))
    b->shared[b->nshared++] = Range{c, bytes, name};
}

inline void check_align(const void* p, size_t align, const char* what, const std::string& where) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (__builtin_expect(a % align != 0, 0))
    fail(std::string(what) + where + " is misaligned: address % " + std::to_string(align) + " = " +
         std::to_string(a % align) + " (the GPU requires " + std::to_string(align) + "-byte alignment)");
}

template <class T>
struct Ptr {
  T* cur = nullptr;
  T* begin = nullptr;
  size_t size = 0;  // elements
  const char* name = "?";
  const char* space = "global";

  Ptr() = default;
  Ptr(T* p, size_t n, const char* nm, const char* sp) : cur(p), begin(p), size(n), name(nm), space(sp) {}
  template <class U, class = std::enable_if_t<std::is_convertible<U*, T*>::value>>
  Ptr(const Ptr<U>& o) : cur(o.cur), begin(o.begin), size(o.size), name(o.name), space(o.space) {}

  ptrdiff_t offset() const { return cur - begin; }
  std::string where(ptrdiff_t idx) const {
    return " at element index " + std::to_string(idx) + " of " + space + " buffer '" + name + "'";
  }
  [[noreturn]] void out_of_bounds(const char* op, ptrdiff_t idx, ptrdiff_t count) const {
    std::string range = count == 1 ? "element index " + std::to_string(idx)
                                   : "elements [" + std::to_string(idx) + ", " + std::to_string(idx + count) + ")";
    fail(std::string(op) + " out of bounds: " + range + " of " + space + " buffer '" + name + "' (size " +
         std::to_string(size) + " elements)");
  }
  void check(const char* op, ptrdiff_t idx, ptrdiff_t count) const {
    if (__builtin_expect(idx < 0 || idx + count > static_cast<ptrdiff_t>(size), 0)) out_of_bounds(op, idx, count);
  }
  T& at(ptrdiff_t i, const void* site = nullptr) const {
    check("access", offset() + i, 1);
#ifdef SL_EMU_BANKS
    if (site && space[0] == 's') bank_note(site, cur + i, sizeof(T), name, "load/store");
#endif
    return cur[i];
  }
  template <class I, class = std::enable_if_t<std::is_integral<I>::value>>
  SL_EMU_SITE_FN T& operator[](I i) const { return at(static_cast<ptrdiff_t>(i), SL_EMU_SITE); }
  SL_EMU_SITE_FN T& operator*() const { return at(0, SL_EMU_SITE); }
  SL_EMU_SITE_FN T* operator->() const { return &at(0, SL_EMU_SITE); }
  // Escaping to a raw pointer is allowed anywhere inside the buffer or one past its end.
  operator T*() const {
    if (offset() < 0 || offset() > static_cast<ptrdiff_t>(size)) out_of_bounds("pointer conversion", offset(), 1);
    return cur;
  }

  template <class I, class = std::enable_if_t<std::is_integral<I>::value>>
  Ptr operator+(I i) const { Ptr r = *this; r.cur += static_cast<ptrdiff_t>(i); return r; }
  template <class I, class = std::enable_if_t<std::is_integral<I>::value>>
  Ptr operator-(I i) const { Ptr r = *this; r.cur -= static_cast<ptrdiff_t>(i); return r; }
  ptrdiff_t operator-(const Ptr& o) const { return cur - o.cur; }
  template <class I, class = std::enable_if_t<std::is_integral<I>::value>>
  Ptr& operator+=(I i) { cur += static_cast<ptrdiff_t>(i); return *this; }
  template <class I, class = std::enable_if_t<std::is_integral<I>::value>>
  Ptr& operator-=(I i) { cur -= static_cast<ptrdiff_t>(i); return *this; }
  Ptr& operator++() { ++cur; return *this; }
  Ptr& operator--() { --cur; return *this; }
  Ptr operator++(int) { Ptr r = *this; ++cur; return r; }
  Ptr operator--(int) { Ptr r = *this; --cur; return r; }
  bool operator==(const Ptr& o) const { return cur == o.cur; }
  bool operator!=(const Ptr& o) const { return cur != o.cur; }
  bool operator<(const Ptr& o) const { return cur < o.cur; }
  bool operator<=(const Ptr& o) const { return cur <= o.cur; }
  bool operator>(const Ptr& o) const { return cur > o.cur; }
  bool operator>=(const Ptr& o) const { return cur >= o.cur; }
};

template <class I, class T, class = std::enable_if_t<std::is_integral<I>::value>>
inline Ptr<T> operator+(I i, const Ptr<T>& p) { return p + i; }

template <class T, size_t N>
struct SharedArray {
  alignas(16) T data[N];
};

template <class T>
inline Ptr<T> shared_array(T* data, size_t n, const char* name, bool poison = true) {
  register_shared(const_cast<void*>(static_cast<const void*>(data)), n * sizeof(T), name, poison);
  return Ptr<T>(data, n, name, "shared");
}

inline unsigned char* dyn_shared_raw() { return sl_emu_tls_block->dyn_smem; }

inline Ptr<unsigned char> dyn_shared(const char* name) {
  const BlockCtx* b = sl_emu_tls_block;
  return Ptr<unsigned char>(b->dyn_smem, b->dyn_bytes, name, "shared");
}

template <class T, class O, class N>
inline Ptr<T> shared_view(const Ptr<unsigned char>& base, O byte_offset, N n, const char* name) {
  const ptrdiff_t off = base.offset() + static_cast<ptrdiff_t>(byte_offset);
  const ptrdiff_t bytes = static_cast<ptrdiff_t>(n) * static_cast<ptrdiff_t>(sizeof(T));
  if (off < 0 || n < 0 || off + bytes > static_cast<ptrdiff_t>(base.size))
    fail("SL_SHARED_VIEW '" + std::string(name) + "' covers bytes [" + std::to_string(off) + ", " +
         std::to_string(off + bytes) + ") but the launch has only " + std::to_string(base.size) +
         " bytes of dynamic shared memory");
  T* p = reinterpret_cast<T*>(base.begin + off);
  check_align(p, alignof(T), "SL_SHARED_VIEW '", std::string(name) + "'");
  return shared_array(p, static_cast<size_t>(n), name, false);  // already poisoned at block start
}

// ---- vector loads and stores ----
template <class VT, class T>
constexpr ptrdiff_t vec_elems() {
  static_assert(sizeof(VT) % sizeof(T) == 0, "SL_VLOAD/SL_VSTORE: the vector size must be a multiple of the element size");
  return static_cast<ptrdiff_t>(sizeof(VT) / sizeof(T));
}

template <class VT, class T, class I>
inline VT vload_at(const T* p, I idx, const char* vt, const void*) {
  vec_elems<VT, T>();
  const T* a = p + idx;
  check_align(a, alignof(VT), "SL_VLOAD<", std::string(vt) + "> at address " + hexaddr(a));
  VT v;
  std::memcpy(&v, a, sizeof(VT));
  return v;
}

template <class VT, class T, class I, class V>
inline void vstore_at(T* p, I idx, const V& value, const char* vt, const void*) {
  vec_elems<VT, T>();
  T* a = p + idx;
  check_align(a, alignof(VT), "SL_VSTORE<", std::string(vt) + "> at address " + hexaddr(a));
  const VT v = value;
  std::memcpy(a, &v, sizeof(VT));
}

template <class VT, class T, class I>
inline VT vload_at(const Ptr<T>& p, I idx, const char* vt, const void* site) {
  const ptrdiff_t at = p.offset() + static_cast<ptrdiff_t>(idx);
  p.check(("SL_VLOAD<" + std::string(vt) + ">").c_str(), at, vec_elems<VT, T>());
  check_align(p.cur + idx, alignof(VT), "SL_VLOAD<", std::string(vt) + ">" + p.where(at));
#ifdef SL_EMU_BANKS
  if (site && p.space[0] == 's') bank_note(site, p.cur + idx, sizeof(VT), p.name, "vector load");
#endif
  VT v;
  std::memcpy(&v, p.cur + idx, sizeof(VT));
  return v;
}

template <class VT, class T, class I, class V>
inline void vstore_at(const Ptr<T>& p, I idx, const V& value, const char* vt, const void* site) {
  const ptrdiff_t at = p.offset() + static_cast<ptrdiff_t>(idx);
  p.check(("SL_VSTORE<" + std::string(vt) + ">").c_str(), at, vec_elems<VT, T>());
  check_align(p.cur + idx, alignof(VT), "SL_VSTORE<", std::string(vt) + ">" + p.where(at));
#ifdef SL_EMU_BANKS
  if (site && p.space[0] == 's') bank_note(site, p.cur + idx, sizeof(VT), p.name, "vector store");
#endif
  const VT v = value;
  std::memcpy(p.cur + idx, &v, sizeof(VT));
}

// What the SL_V* macros call, from the kernel itself (so SL_EMU_SITE is the kernel's call site).
template <class VT, class P, class I>
SL_EMU_SITE_FN inline VT vload(const P& p, I idx, const char* vt) {
  return vload_at<VT>(p, idx, vt, SL_EMU_SITE);
}

template <class VT, class P, class I, class V>
SL_EMU_SITE_FN inline void vstore(P&& p, I idx, const V& value, const char* vt) {  // P&&: arrays stay writable
  vstore_at<VT>(p, idx, value, vt, SL_EMU_SITE);
}

template <class VT, class R, class P, class I>
SL_EMU_SITE_FN inline void vload_regs(R* regs, const P& p, I idx, const char* vt) {
  check_align(regs, alignof(VT), "SL_VLOAD_REGS<", std::string(vt) + "> into a register array");
  const VT v = vload_at<VT>(p, idx, vt, SL_EMU_SITE);
  std::memcpy(regs, &v, sizeof(VT));
}

template <class VT, class P, class I, class R>
SL_EMU_SITE_FN inline void vstore_regs(P&& p, I idx, const R* regs, const char* vt) {
  check_align(regs, alignof(VT), "SL_VSTORE_REGS<", std::string(vt) + "> from a register array");
  VT v;
  std::memcpy(&v, regs, sizeof(VT));
  vstore_at<VT>(p, idx, v, vt, SL_EMU_SITE);
}

}  // namespace sl_emu

#ifdef SL_EMU_BOUNDS
#define SL_GLOBAL(T) ::sl_emu::Ptr<T>
#define SL_SHARED(T, name, n)                                                   \
  static thread_local ::sl_emu::SharedArray<T, (n)> name##_sl_emu_storage;      \
  ::sl_emu::Ptr<T> name = ::sl_emu::shared_array<T>(name##_sl_emu_storage.data, (n), #name)
#define SL_DYN_SHARED(name) ::sl_emu::Ptr<unsigned char> name = ::sl_emu::dyn_shared(#name)
#define SL_SHARED_VIEW(T, name, base, byte_offset, n) \
  ::sl_emu::Ptr<T> name = ::sl_emu::shared_view<T>((base), (byte_offset), (n), #name)
#else
#define SL_GLOBAL(T) T* __restrict__
#define SL_SHARED(T, name, n) static thread_local T name[n] __attribute__((aligned(16)))
#define SL_DYN_SHARED(name) unsigned char* name = ::sl_emu::dyn_shared_raw()
#define SL_SHARED_VIEW(T, name, base, byte_offset, n) T* name = reinterpret_cast<T*>((base) + (byte_offset))
#endif
#define SL_VLOAD(VT, buf, idx) (::sl_emu::vload<VT>((buf), (idx), #VT))
#define SL_VSTORE(VT, buf, idx, value) (::sl_emu::vstore<VT>((buf), (idx), (value), #VT))
// Through a register array: memcpy, not a pointer cast, so g++'s aliasing rules keep the element reads.
#define SL_VLOAD_REGS(VT, regs, buf, idx) (::sl_emu::vload_regs<VT>((regs), (buf), (idx), #VT))
#define SL_VSTORE_REGS(VT, buf, idx, regs) (::sl_emu::vstore_regs<VT>((buf), (idx), (regs), #VT))

// ---- read-only loads and atomics (relaxed, like CUDA's; blocks run concurrently on OS threads) ----
template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline std::remove_const_t<T> __ldg(const ::sl_emu::Ptr<T>& p) { return *p; }

template <class T>
inline T sl_emu_atomic_rmw(T* a, T v, T (*op)(T, T)) {
  T old;
  __atomic_load(a, &old, __ATOMIC_RELAXED);
  T upd = op(old, v);
  while (!__atomic_compare_exchange(a, &old, &upd, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) upd = op(old, v);
  return old;
}
inline float atomicAdd(float* a, float v) { return sl_emu_atomic_rmw<float>(a, v, [](float x, float y) { return x + y; }); }
inline double atomicAdd(double* a, double v) {
  return sl_emu_atomic_rmw<double>(a, v, [](double x, double y) { return x + y; });
}
inline float atomicMax(float* a, float v) {
  return sl_emu_atomic_rmw<float>(a, v, [](float x, float y) { return std::fmax(x, y); });
}
inline float atomicMin(float* a, float v) {
  return sl_emu_atomic_rmw<float>(a, v, [](float x, float y) { return std::fmin(x, y); });
}
#define SL_EMU_INT_ATOMICS(T)                                                                     \
  inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }            \
  inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }            \
  inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }            \
  inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }              \
  inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }            \
  inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }          \
  inline T atomicMax(T* a, T v) { return sl_emu_atomic_rmw<T>(a, v, [](T x, T y) { return x > y ? x : y; }); } \
  inline T atomicMin(T* a, T v) { return sl_emu_atomic_rmw<T>(a, v, [](T x, T y) { return x < y ? x : y; }); } \
  inline T atomicCAS(T* a, T cmp, T v) {                                                          \
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);           \
    return cmp;                                                                                   \
  }
SL_EMU_INT_ATOMICS(int)
SL_EMU_INT_ATOMICS(unsigned int)
SL_EMU_INT_ATOMICS(unsigned long long)
#undef SL_EMU_INT_ATOMICS
inline float atomicExch(float* a, float v) {
  float old;
  __atomic_exchange(a, &v, &old, __ATOMIC_RELAXED);
  return old;
}
// Checked-pointer forms: the element is bounds-checked, then the raw atomic runs.
#define SL_EMU_PTR_ATOMIC(F)                                                   \
  template <class T, class V>                                                  \
  inline auto F(const ::sl_emu::Ptr<T>& p, V v) -> decltype(F(&*p, v)) { return F(&*p, v); }
SL_EMU_PTR_ATOMIC(atomicAdd)
SL_EMU_PTR_ATOMIC(atomicSub)
SL_EMU_PTR_ATOMIC(atomicMax)
SL_EMU_PTR_ATOMIC(atomicMin)
SL_EMU_PTR_ATOMIC(atomicExch)
SL_EMU_PTR_ATOMIC(atomicAnd)
SL_EMU_PTR_ATOMIC(atomicOr)
SL_EMU_PTR_ATOMIC(atomicXor)
#undef SL_EMU_PTR_ATOMIC
template <class T, class V>
inline auto atomicCAS(const ::sl_emu::Ptr<T>& p, V cmp, V v) -> decltype(atomicCAS(&*p, cmp, v)) {
  return atomicCAS(&*p, cmp, v);
}

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
