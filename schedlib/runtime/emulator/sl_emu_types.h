// schedlib CUDA emulator: CUDA vector types, dim3, and the device math / bit-cast intrinsics.
//
// Vector types carry the same size and alignment as in CUDA, because the alignment rules of
// SL_VLOAD/SL_VSTORE (checked by the emulator) must match the GPU's. Fast-math intrinsics
// (__expf, __fdividef, ...) are computed at full precision: the emulator checks logic, not ulps.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "sl_emu_half.h"

#define SL_EMU_VEC2(T, N, A) struct alignas(A) N { T x, y; };
#define SL_EMU_VEC3(T, N) struct N { T x, y, z; };
#define SL_EMU_VEC4(T, N, A) struct alignas(A) N { T x, y, z, w; };
SL_EMU_VEC2(float, float2, 8)
SL_EMU_VEC3(float, float3)
SL_EMU_VEC4(float, float4, 16)
SL_EMU_VEC2(double, double2, 16)
SL_EMU_VEC2(int, int2, 8)
SL_EMU_VEC3(int, int3)
SL_EMU_VEC4(int, int4, 16)
SL_EMU_VEC2(unsigned int, uint2, 8)
SL_EMU_VEC3(unsigned int, uint3)
SL_EMU_VEC4(unsigned int, uint4, 16)
SL_EMU_VEC2(short, short2, 4)
SL_EMU_VEC2(unsigned short, ushort2, 4)
SL_EMU_VEC4(short, short4, 8)
SL_EMU_VEC4(unsigned short, ushort4, 8)
SL_EMU_VEC2(signed char, char2, 2)
SL_EMU_VEC4(signed char, char4, 4)
SL_EMU_VEC2(unsigned char, uchar2, 2)
SL_EMU_VEC4(unsigned char, uchar4, 4)
SL_EMU_VEC2(long long, longlong2, 16)
#undef SL_EMU_VEC2
#undef SL_EMU_VEC3
#undef SL_EMU_VEC4

inline float2 make_float2(float x, float y) { return {x, y}; }
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int3 make_int3(int x, int y, int z) { return {x, y, z}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline short2 make_short2(short x, short y) { return {x, y}; }
inline ushort2 make_ushort2(unsigned short x, unsigned short y) { return {x, y}; }
inline char2 make_char2(signed char x, signed char y) { return {x, y}; }
inline char4 make_char4(signed char x, signed char y, signed char z, signed char w) { return {x, y, z, w}; }
inline uchar4 make_uchar4(unsigned char x, unsigned char y, unsigned char z, unsigned char w) {
  return {x, y, z, w};
}

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return {x, y, z}; }
};

static constexpr int warpSize = 32;

// ---- 16-bit pair <-> float2 ----
inline float2 __half22float2(__half2 v) { return {static_cast<float>(v.x), static_cast<float>(v.y)}; }
inline __half2 __float22half2_rn(float2 v) { return {__half(v.x), __half(v.y)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {static_cast<float>(v.x), static_cast<float>(v.y)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return {__nv_bfloat16(v.x), __nv_bfloat16(v.y)}; }

// ---- bit casts ----
template <class To, class From>
inline To sl_emu_bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From), "bit cast between types of different size");
  To r;
  std::memcpy(&r, &v, sizeof(To));
  return r;
}
inline unsigned int __float_as_uint(float f) { return sl_emu_bit_cast<unsigned int>(f); }
inline int __float_as_int(float f) { return sl_emu_bit_cast<int>(f); }
inline float __uint_as_float(unsigned int u) { return sl_emu_bit_cast<float>(u); }
inline float __int_as_float(int i) { return sl_emu_bit_cast<float>(i); }
inline long long __double_as_longlong(double d) { return sl_emu_bit_cast<long long>(d); }
inline double __longlong_as_double(long long v) { return sl_emu_bit_cast<double>(v); }

// ---- float math (the C functions expf, tanhf, erff, ... come from <cmath>) ----
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float2int_rd(float x) { return static_cast<int>(std::floor(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(std::ceil(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }

// ---- integer intrinsics ----
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned int __brev(unsigned int x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
  return (x >> 16) | (x << 16);
}
inline int __mul24(int a, int b) { return (a << 8 >> 8) * (b << 8 >> 8); }
inline unsigned int __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned int __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}

// ---- CUDA's global min/max overloads ----
#define SL_EMU_MINMAX(A, B, R)                                        \
  inline R min(A a, B b) { return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(a) : static_cast<R>(b); } \
  inline R max(A a, B b) { return static_cast<R>(a) > static_cast<R>(b) ? static_cast<R>(a) : static_cast<R>(b); }
SL_EMU_MINMAX(int, int, int)
SL_EMU_MINMAX(unsigned int, unsigned int, unsigned int)
SL_EMU_MINMAX(int, unsigned int, unsigned int)
SL_EMU_MINMAX(unsigned int, int, unsigned int)
SL_EMU_MINMAX(long, long, long)
SL_EMU_MINMAX(unsigned long, unsigned long, unsigned long)
SL_EMU_MINMAX(long long, long long, long long)
SL_EMU_MINMAX(unsigned long long, unsigned long long, unsigned long long)
#undef SL_EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline double min(float a, double b) { return std::fmin(static_cast<double>(a), b); }
inline double max(float a, double b) { return std::fmax(static_cast<double>(a), b); }
inline double min(double a, float b) { return std::fmin(a, static_cast<double>(b)); }
inline double max(double a, float b) { return std::fmax(a, static_cast<double>(b)); }
