// schedlib CUDA emulator: __half / __nv_bfloat16 and their x2 forms, bit-exact with the GPU.
//
// Storage is the IEEE binary16 / bfloat16 bit pattern (numpy float16, and the upper 16 bits of a
// float32 for bf16), so arrays pass between numpy and kernels unchanged. Every conversion rounds to
// nearest-even. Binary ops are computed in float and rounded once: float has more than 2p+2 bits
// for both formats, so that double rounding is exact; fma goes through double for the same reason.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sl_emu {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// float -> binary16, round to nearest even; NaN keeps its top payload bits like numpy does.
inline uint16_t f2h_bits(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {  // below 2^-14: subnormal; adding 0.5 puts the 2^-24 unit in the last bit
    const float t = bits_f32(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (f32_bits(t) - 0x3f000000u));
  }
  const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

inline float h2f(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-08f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// float -> bfloat16, round to nearest even (quiet NaN kept).
inline uint16_t f2bf_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf2f(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

// double -> float rounded to odd: a second rounding to any format of <= 22 bits is then exact.
inline float d2f_odd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return bits_f32(f32_bits(f) | 1u);
}

}  // namespace sl_emu

struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(sl_emu::f2h_bits(f)) {}
  __half(double d) : __x(sl_emu::f2h_bits(sl_emu::d2f_odd(d))) {}
  template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
  __half(I v) : __half(static_cast<double>(v)) {}
  operator float() const { return sl_emu::h2f(__x); }
};

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(sl_emu::f2bf_bits(f)) {}
  __nv_bfloat16(double d) : __x(sl_emu::f2bf_bits(sl_emu::d2f_odd(d))) {}
  template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
  __nv_bfloat16(I v) : __nv_bfloat16(static_cast<double>(v)) {}
  operator float() const { return sl_emu::bf2f(__x); }
};

struct alignas(4) __half2 {
  __half x, y;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
typedef __half half;
typedef __half2 half2;
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

// ---- scalar conversions ----
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline __half __int2half_rn(int v) { return __half(v); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline int __half2int_rn(__half h) { return static_cast<int>(std::nearbyint(static_cast<float>(h))); }
inline int __half2int_rz(__half h) { return static_cast<int>(static_cast<float>(h)); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return static_cast<short>(h.__x); }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline __half __short_as_half(short s) { return __ushort_as_half(static_cast<unsigned short>(s)); }

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline float __bfloat162float(__nv_bfloat16 b) { return static_cast<float>(b); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 b; b.__x = u; return b; }

// ---- pair conversions ----
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __half2half2(__half a) { return {a, a}; }
inline __half2 __float2half2_rn(float f) { return {__half(f), __half(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half __low2half(__half2 v) { return v.x; }
inline __half __high2half(__half2 v) { return v.y; }
inline float __low2float(__half2 v) { return static_cast<float>(v.x); }
inline float __high2float(__half2 v) { return static_cast<float>(v.y); }
inline __half2 __lows2half2(__half2 a, __half2 b) { return {a.x, b.x}; }
inline __half2 __highs2half2(__half2 a, __half2 b) { return {a.y, b.y}; }

inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return {a, b}; }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return {a, a}; }
inline __nv_bfloat162 __float2bfloat162_rn(float f) { return {__nv_bfloat16(f), __nv_bfloat16(f)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 v) { return v.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 v) { return v.y; }
inline float __low2float(__nv_bfloat162 v) { return static_cast<float>(v.x); }
inline float __high2float(__nv_bfloat162 v) { return static_cast<float>(v.y); }

// ---- arithmetic, shared by both 16-bit formats ----
#define SL_EMU_16BIT_OPS(H, H2)                                                                        \
  inline H operator+(H a, H b) { return H(static_cast<float>(a) + static_cast<float>(b)); }           \
  inline H operator-(H a, H b) { return H(static_cast<float>(a) - static_cast<float>(b)); }           \
  inline H operator*(H a, H b) { return H(static_cast<float>(a) * static_cast<float>(b)); }           \
  inline H operator/(H a, H b) { return H(static_cast<float>(a) / static_cast<float>(b)); }           \
  inline H operator-(H a) { H r = a; r.__x ^= 0x8000u; return r; }                                    \
  inline H operator+(H a) { return a; }                                                                \
  inline H& operator+=(H& a, H b) { return a = a + b; }                                               \
  inline H& operator-=(H& a, H b) { return a = a - b; }                                               \
  inline H& operator*=(H& a, H b) { return a = a * b; }                                               \
  inline H& operator/=(H& a, H b) { return a = a / b; }                                               \
  inline bool operator==(H a, H b) { return static_cast<float>(a) == static_cast<float>(b); }         \
  inline bool operator!=(H a, H b) { return static_cast<float>(a) != static_cast<float>(b); }         \
  inline bool operator<(H a, H b) { return static_cast<float>(a) < static_cast<float>(b); }           \
  inline bool operator<=(H a, H b) { return static_cast<float>(a) <= static_cast<float>(b); }         \
  inline bool operator>(H a, H b) { return static_cast<float>(a) > static_cast<float>(b); }           \
  inline bool operator>=(H a, H b) { return static_cast<float>(a) >= static_cast<float>(b); }         \
  inline H __hadd(H a, H b) { return a + b; }                                                          \
  inline H __hsub(H a, H b) { return a - b; }                                                          \
  inline H __hmul(H a, H b) { return a * b; }                                                          \
  inline H __hdiv(H a, H b) { return a / b; }                                                          \
  inline H __hneg(H a) { return -a; }                                                                  \
  inline H __habs(H a) { H r = a; r.__x &= 0x7fffu; return r; }                                       \
  inline H __hfma(H a, H b, H c) {                                                                     \
    return H(static_cast<double>(static_cast<float>(a)) * static_cast<float>(b) + static_cast<float>(c)); \
  }                                                                                                    \
  inline H __hmax(H a, H b) { return H(std::fmax(static_cast<float>(a), static_cast<float>(b))); }    \
  inline H __hmin(H a, H b) { return H(std::fmin(static_cast<float>(a), static_cast<float>(b))); }    \
  inline bool __heq(H a, H b) { return a == b; }                                                       \
  inline bool __hne(H a, H b) { return a != b; }                                                       \
  inline bool __hlt(H a, H b) { return a < b; }                                                        \
  inline bool __hle(H a, H b) { return a <= b; }                                                       \
  inline bool __hgt(H a, H b) { return a > b; }                                                        \
  inline bool __hge(H a, H b) { return a >= b; }                                                       \
  inline bool __hisnan(H a) { return std::isnan(static_cast<float>(a)); }                              \
  inline H2 operator+(H2 a, H2 b) { return {a.x + b.x, a.y + b.y}; }                                  \
  inline H2 operator-(H2 a, H2 b) { return {a.x - b.x, a.y - b.y}; }                                  \
  inline H2 operator*(H2 a, H2 b) { return {a.x * b.x, a.y * b.y}; }                                  \
  inline H2 operator/(H2 a, H2 b) { return {a.x / b.x, a.y / b.y}; }                                  \
  inline H2 operator-(H2 a) { return {-a.x, -a.y}; }                                                  \
  inline H2& operator+=(H2& a, H2 b) { return a = a + b; }                                            \
  inline H2& operator*=(H2& a, H2 b) { return a = a * b; }                                            \
  inline H2 __hadd2(H2 a, H2 b) { return a + b; }                                                      \
  inline H2 __hsub2(H2 a, H2 b) { return a - b; }                                                      \
  inline H2 __hmul2(H2 a, H2 b) { return a * b; }                                                      \
  inline H2 __h2div(H2 a, H2 b) { return a / b; }                                                      \
  inline H2 __hneg2(H2 a) { return -a; }                                                               \
  inline H2 __hfma2(H2 a, H2 b, H2 c) { return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }     \
  inline H2 __hmax2(H2 a, H2 b) { return {__hmax(a.x, b.x), __hmax(a.y, b.y)}; }                      \
  inline H2 __hmin2(H2 a, H2 b) { return {__hmin(a.x, b.x), __hmin(a.y, b.y)}; }

SL_EMU_16BIT_OPS(__half, __half2)
SL_EMU_16BIT_OPS(__nv_bfloat16, __nv_bfloat162)
#undef SL_EMU_16BIT_OPS

inline __half hsqrt(__half a) { return __half(std::sqrt(static_cast<float>(a))); }
inline __half hexp(__half a) { return __half(std::exp(static_cast<float>(a))); }
inline __nv_bfloat16 hsqrt(__nv_bfloat16 a) { return __nv_bfloat16(std::sqrt(static_cast<float>(a))); }
inline __nv_bfloat16 hexp(__nv_bfloat16 a) { return __nv_bfloat16(std::exp(static_cast<float>(a))); }
