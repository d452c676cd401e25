// schedlib CUDA emulator: lets g++ compile and run the exact CUDA source schedlib generates.
//
// The generated source starts with schedlib/codegen/cuda_prelude.cuh, whose non-nvcc branch
// includes this header. Built with `g++ -O1 -std=c++17 -shared -fPIC` (+ -DSL_EMU_BOUNDS for the
// checked mode) into a shared library that the Python side (schedlib.runtime.emulator) drives
// through the C ABI in sl_emu_launch.h. The pieces, each in its own header:
//   sl_emu_half.h    __half / __nv_bfloat16, bit-exact conversions and arithmetic
//   sl_emu_types.h   vector types, dim3, math and bit-cast intrinsics
//   sl_emu_block.h   the state of a running block: threads, warps, barriers, register pool
//   sl_emu_fiber.h   CUDA threads as fibers, block barrier, deadlock detection
//   sl_emu_memory.h  SL_GLOBAL/SL_SHARED/SL_VLOAD..., checked pointers, atomics
//   sl_emu_named_barrier.h  named barriers (bar.sync id, count)
//   sl_emu_warp.h    shuffles, votes, __syncwarp, ldmatrix, mma, cp.async
//   sl_emu_wgmma.h   Hopper wgmma.mma_async reading shared memory through matrix descriptors
//   sl_emu_tma.h     Hopper mbarrier phases and TMA tensor copies into shared memory
//   sl_emu_launch.h  launch ABI, parameter checks, the OS-thread pool
//   sl_emu_banks.h   shared-memory bank census per access site (-DSL_EMU_BANKS, implies SL_EMU_BOUNDS)
#pragma once
#if defined(__CUDACC__)
#error "sl_cuda_emu.h is the CPU emulator; nvcc uses the real CUDA definitions"
#endif

#if defined(SL_EMU_BANKS) && !defined(SL_EMU_BOUNDS)
#define SL_EMU_BOUNDS  // the census reads shared accesses through the checked pointers
#endif

// System headers first, with their own visibility. Everything the emulator itself defines stays
// inside the library (direct calls, no PLT); only the generated entry points are exported.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
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
#ifdef SL_EMU_BANKS
#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#endif

#pragma GCC visibility push(hidden)
#include "sl_emu_launch.h"
#pragma GCC visibility pop

// CUDA built-in variables: per fiber (threadIdx) or per block (the rest), read-only.
#define threadIdx (static_cast<const uint3&>(sl_emu_tls_fiber->tid))
#define blockIdx (static_cast<const uint3&>(sl_emu_tls_block->blockIdx))
#define blockDim (static_cast<const dim3&>(sl_emu_tls_block->blockDim))
#define gridDim (static_cast<const dim3&>(sl_emu_tls_block->gridDim))

// CUDA declaration specifiers. Kernels are plain C++ functions; __shared__ outside the SL_SHARED
// macro still works (one instance per OS thread = per running block).
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define SL_MAX_REGISTERS(...)  // the prelude's register cap (codegen/register_cap.py): nothing to cap here
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
