// ---- schedlib CUDA prelude: every generated kernel source starts with this text, verbatim. ----
// The same source is compiled by nvcc/NVRTC for the GPU and by g++ against the CPU emulator
// (schedlib/runtime/emulator/sl_cuda_emu.h), so generated code uses only the SL_* macros and
// sl_* wrappers below for anything whose spelling differs between the two.
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// Kernel pointer parameter (the emulator turns it into a bounds-checked pointer in checked mode).
#define SL_GLOBAL(T) T* __restrict__
// A kernel's signature under a target whose profile caps registers per thread below what its block size
// allows (codegen/register_cap.py): __maxnreg__ from CUDA 12.4, else the minimum of resident blocks that
// leaves at most n registers per thread (which may round the cap down).
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4)
#define SL_MAX_REGISTERS(threads, n) __maxnreg__(n)
#else
#define SL_MAX_REGISTERS(threads, n) __launch_bounds__(threads, (65536 + (threads) * (n) - 1) / ((threads) * (n)))
#endif
// A static shared array inside a kernel body.
#define SL_SHARED(T, name, n) __shared__ __align__(16) T name[n]
// The dynamic shared memory of the launch, as bytes; carve typed views with SL_SHARED_VIEW.
#define SL_DYN_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#define SL_SHARED_VIEW(T, name, base, byte_offset, n) T* name = reinterpret_cast<T*>((base) + (byte_offset))
// Vector access of type VT at element index idx of buf (the address must be sizeof(VT)-aligned).
#define SL_VLOAD(VT, buf, idx) (*reinterpret_cast<const VT*>(&(buf)[idx]))
#define SL_VSTORE(VT, buf, idx, value) (*reinterpret_cast<VT*>(&(buf)[idx]) = (value))
// The same through a 16-byte aligned register array regs (a vectorized loop that computes, not copies).
#define SL_VLOAD_REGS(VT, regs, buf, idx) (*reinterpret_cast<VT*>(regs) = SL_VLOAD(VT, buf, idx))
#define SL_VSTORE_REGS(VT, buf, idx, regs) SL_VSTORE(VT, buf, idx, *reinterpret_cast<const VT*>(regs))

// D = A * B + C on one 16x8x16 tile per warp; fragments follow the PTX ISA layout of
// mma.m16n8k16 (a: 4 x .f16x2, b: 2 x .f16x2, c/d: 4 x f32 per lane). Needs sm_80+.
__device__ __forceinline__ void sl_mma_m16n8k16_f16f32(float d[4], const unsigned a[4],
                                                       const unsigned b[2], const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ void sl_mma_m16n8k16_bf16f32(float d[4], const unsigned a[4],
                                                        const unsigned b[2], const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// ldmatrix: lanes 8i..8i+7 give the 16-byte row addresses of 8x8 b16 matrix i (x4: i < 4, x2: i < 2).
__device__ __forceinline__ void sl_ldmatrix_x4(unsigned r[4], const void* smem_row_ptr) {
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

__device__ __forceinline__ void sl_ldmatrix_x2(unsigned r[2], const void* smem_row_ptr) {
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
}

__device__ __forceinline__ void sl_ldmatrix_x4_trans(unsigned r[4], const void* smem_row_ptr) {
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

__device__ __forceinline__ void sl_ldmatrix_x2_trans(unsigned r[2], const void* smem_row_ptr) {
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
}

// Asynchronous 16-byte global -> shared copy (both addresses 16-byte aligned). Needs sm_80+.
__device__ __forceinline__ void sl_cp_async_16(void* smem_dst, const void* gmem_src) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(gmem_src) : "memory");
}

__device__ __forceinline__ void sl_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void sl_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// Barrier ID among the first COUNT threads to arrive (whole warps); barrier 0 is __syncthreads'.
template <int ID, int COUNT>
__device__ __forceinline__ void sl_named_barrier() {
  static_assert(ID >= 1 && ID < 16, "named barriers are 1..15 (barrier 0 is __syncthreads')");
  static_assert(COUNT > 0 && COUNT % 32 == 0, "a named barrier counts whole warps");
  asm volatile("bar.sync %0, %1;\n" :: "n"(ID), "n"(COUNT) : "memory");
}
#else
#include "sl_cuda_emu.h"
#endif
// ---- end of the schedlib CUDA prelude ----
