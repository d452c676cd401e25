// ---- schedlib Hopper prelude: appended after cuda_prelude.cuh to sources whose kernels use wgmma. ----
// Needs sm_90a (compute_90a): wgmma.* exists on no other target. The emulator defines the same names
// (schedlib/runtime/emulator/sl_emu_wgmma.h), performing each operation at the wait that completes it.
#if defined(__CUDACC__)

// Shared-window address of a shared-memory pointer (what descriptors and cp.async take).
__device__ __forceinline__ unsigned sl_smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void sl_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Shared memory written by the generic proxy (st.shared, cp.async) and next read by wgmma: each writing
// thread fences before the barrier that publishes the data.
__device__ __forceinline__ void sl_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void sl_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void sl_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// The registers of each thread of this warpgroup become N (every thread of the warpgroup executes it): a
// producer warpgroup gives registers back to the block's pool, the accumulator warpgroups take them.
template <int N>
__device__ __forceinline__ void sl_setmaxnreg_dec() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N>
__device__ __forceinline__ void sl_setmaxnreg_inc() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}

// Accumulator operand lists: d[i..i+7] as read-write float registers.
#define SL_WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
    "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define SL_WG_D32(i) SL_WG_D8(i), SL_WG_D8(i + 8), SL_WG_D8(i + 16), SL_WG_D8(i + 24)
#define SL_WG_D16_ SL_WG_D8(0)
#define SL_WG_D32_ SL_WG_D8(0), SL_WG_D8(8)
#define SL_WG_D64_ SL_WG_D32(0)
#define SL_WG_D128_ SL_WG_D32(0), SL_WG_D32(32)
#define SL_WG_D256_ SL_WG_D32(0), SL_WG_D32(32), SL_WG_D32(64), SL_WG_D32(96)

// sl_wgmma_n<N>_<type><TRANS_A, TRANS_B>(d, desc_a, desc_b): D += A * B on m64nNk16 with f32 accumulators
// (d: this thread's N/2 registers); TRANS_A/TRANS_B = 1 read A M-major / B N-major. Per N: the accumulator
// placeholders, then the operand numbers of the descriptors, transposes and the always-true scale-d.
#define SL_WG_ACC16 "%0, %1, %2, %3, %4, %5, %6, %7"
#define SL_WG_SCALE16 "%12"
#define SL_WG_REST16 "%8, %9, p, 1, 1, %10, %11"
#define SL_WG_ACC32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define SL_WG_SCALE32 "%20"
#define SL_WG_REST32 "%16, %17, p, 1, 1, %18, %19"
#define SL_WG_ACC64 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SL_WG_SCALE64 "%36"
#define SL_WG_REST64 "%32, %33, p, 1, 1, %34, %35"
#define SL_WG_ACC128 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SL_WG_SCALE128 "%68"
#define SL_WG_REST128 "%64, %65, p, 1, 1, %66, %67"
#define SL_WG_ACC256 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define SL_WG_SCALE256 "%132"
#define SL_WG_REST256 "%128, %129, p, 1, 1, %130, %131"
#define SL_WGMMA(N, TY)                                                                              \
  template <int TA, int TB>                                                                          \
  __device__ __forceinline__ void sl_wgmma_n##N##_##TY(float* d, unsigned long long da,             \
                                                       unsigned long long db) {                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SL_WG_SCALE##N ", 0;\n"                           \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " {" SL_WG_ACC##N "}, " \
                 SL_WG_REST##N ";\n}\n"                                                              \
                 : SL_WG_D##N##_                                                                   \
                 : "l"(da), "l"(db), "n"(TA), "n"(TB), "r"(1));                                     \
  }
SL_WGMMA(16, f16)
SL_WGMMA(16, bf16)
SL_WGMMA(32, f16)
SL_WGMMA(32, bf16)
SL_WGMMA(64, f16)
SL_WGMMA(64, bf16)
SL_WGMMA(128, f16)
SL_WGMMA(128, bf16)
SL_WGMMA(256, f16)
SL_WGMMA(256, bf16)
#undef SL_WGMMA
#undef SL_WG_ACC16
#undef SL_WG_SCALE16
#undef SL_WG_REST16
#undef SL_WG_ACC32
#undef SL_WG_SCALE32
#undef SL_WG_REST32
#undef SL_WG_ACC64
#undef SL_WG_SCALE64
#undef SL_WG_REST64
#undef SL_WG_ACC128
#undef SL_WG_SCALE128
#undef SL_WG_REST128
#undef SL_WG_ACC256
#undef SL_WG_SCALE256
#undef SL_WG_REST256
#undef SL_WG_D16_
#undef SL_WG_D32_
#undef SL_WG_D64_
#undef SL_WG_D128_
#undef SL_WG_D256_
#undef SL_WG_D32
#undef SL_WG_D8

// ---- transaction barriers (mbarrier) and TMA tensor copies (sl_emu_tma.h emulates them) ----
// The tensor map is the driver's 128-byte CUtensorMap, copied to global memory by the runtime and passed as
// a pointer; the kernel acquires it for the tensor-map proxy once before its first copy.
__device__ __forceinline__ void sl_mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(sl_smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the asynchronous proxy (the TMA unit completes their bytes).
__device__ __forceinline__ void sl_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void sl_mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(sl_smem_addr(bar)), "r"(bytes)
               : "memory");
}
// One arrival without bytes: a consumer releasing a ring slot (release semantics: its reads of the slot, the
// wgmmas it waited for, happen before the producer's wait returns).
__device__ __forceinline__ void sl_mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(sl_smem_addr(bar)) : "memory");
}
// A phase that never completes (bytes announced but never delivered, a wrong parity) would hang the GPU until
// the process is killed; after 2^26 failed tries (seconds: each try waits a while in hardware) the wait gives
// up, and the kernel finishes with wrong data that the caller's result check reports.  (Trapping instead
// would give the loop an exit with wgmmas in flight, and ptxas then serialises them: warning C7517.)
#define SL_MBAR_MAX_TRIES (1u << 26)
__device__ __forceinline__ void sl_mbar_wait(unsigned long long* bar, unsigned parity) {
  const unsigned addr = sl_smem_addr(bar);
  unsigned done, tries = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(addr), "r"(parity) : "memory");
  } while (!done && ++tries < SL_MBAR_MAX_TRIES);
}
__device__ __forceinline__ void sl_tmap_acquire(const unsigned long long* tmap) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" :: "l"(tmap) : "memory");
}
__device__ __forceinline__ void sl_tma_load_3d(void* dst, const unsigned long long* tmap, int c0, int c1, int c2,
                                               unsigned long long* bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%2, %3, %4}], [%5];\n"
               :: "r"(sl_smem_addr(dst)), "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(sl_smem_addr(bar)) : "memory");
}
#endif  // __CUDACC__
