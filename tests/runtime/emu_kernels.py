"""Hand-written kernels in the schedlib CUDA convention, shared by the emulator and nvcc tests.

Each constant is a kernel body without the prelude; ``full(...)`` prepends the prelude, giving the
exact text the code generator would emit.
"""

from __future__ import annotations

import numpy as np
import pytest

from schedlib.runtime.emulator import cuda_prelude, find_gxx

needs_gxx = pytest.mark.skipif(
    find_gxx() is None, reason="g++ not found: the CUDA emulator compiles kernels with g++ (or set SCHEDLIB_GXX)"
)


def poisoned(shape: int | tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    """An output buffer pre-filled with NaN (or all ones bits), so unwritten elements fail checks."""
    if np.issubdtype(dtype, np.floating):
        return np.full(shape, np.nan, dtype=dtype)
    fill = np.iinfo(dtype).max if np.issubdtype(dtype, np.unsignedinteger) else -1
    return np.full(shape, fill, dtype=dtype)


def full(*kernels: str) -> str:
    """The prelude followed by the given kernels: a complete generated source."""
    return cuda_prelude() + "\n" + "\n".join(kernels)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even (numpy has no bfloat16)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def bf16_float(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


VADD = r"""
extern "C" __global__ void __launch_bounds__(256)
vadd(SL_GLOBAL(const float) a, SL_GLOBAL(const float) b, SL_GLOBAL(float) c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
"""

# C[M,N] = A[M,K] @ B[K,N], 16x16 tiles through shared memory, guarded for any size.
MATMUL = r"""
#define TILE 16
extern "C" __global__ void __launch_bounds__(256)
matmul(SL_GLOBAL(const float) A, SL_GLOBAL(const float) B, SL_GLOBAL(float) C, int M, int N, int K) {
  SL_SHARED(float, As, TILE * TILE);
  SL_SHARED(float, Bs, TILE * TILE);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += TILE) {
    As[ty * TILE + tx] = (row < M && k0 + tx < K) ? A[row * K + k0 + tx] : 0.0f;
    Bs[ty * TILE + tx] = (col < N && k0 + ty < K) ? B[(k0 + ty) * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += As[ty * TILE + k] * Bs[k * TILE + tx];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}
"""

# out[r] = sum(x[r, :]); one block per row: strided partial sums, warp shuffles, shared memory.
ROWSUM = r"""
extern "C" __global__ void __launch_bounds__(128)
rowsum(SL_GLOBAL(const float) x, SL_GLOBAL(float) out, int ncols) {
  SL_SHARED(float, partial, 32);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const float* rowp = x + (size_t)blockIdx.x * ncols;
  float s = 0.0f;
  for (int c = threadIdx.x; c < ncols; c += blockDim.x) s += rowp[c];
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) partial[warp] = s;
  __syncthreads();
  if (warp == 0) {
    float v = lane < nwarps ? partial[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) out[blockIdx.x] = v;
  }
}
"""

# 16-bit conversions and arithmetic; __half arrays are numpy float16, __nv_bfloat16 arrays uint16.
HALF_OPS = r"""
extern "C" __global__ void h_convert(SL_GLOBAL(const float) f, SL_GLOBAL(__half) f2h,
                                     SL_GLOBAL(const __half) h, SL_GLOBAL(float) h2f, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  f2h[i] = __float2half_rn(f[i]);
  h2f[i] = __half2float(h[i]);
}

extern "C" __global__ void h_arith(SL_GLOBAL(const float) f, SL_GLOBAL(const __half) ha, SL_GLOBAL(const __half) hb,
                                   SL_GLOBAL(const __half) hc, SL_GLOBAL(__half) hsum, SL_GLOBAL(__half) hprod,
                                   SL_GLOBAL(__half) hfma, SL_GLOBAL(__half) hmax, SL_GLOBAL(float) pair, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  hsum[i] = __hadd(ha[i], hb[i]);
  hprod[i] = ha[i] * hb[i];
  hfma[i] = __hfma(ha[i], hb[i], hc[i]);
  hmax[i] = __hmax(ha[i], hb[i]);
  half2 p = __floats2half2_rn(f[i], 2.0f * f[i]);
  float2 q = __half22float2(__hadd2(p, __halves2half2(ha[i], hb[i])));
  pair[4 * i] = q.x;
  pair[4 * i + 1] = q.y;
  pair[4 * i + 2] = __low2float(p);
  pair[4 * i + 3] = __high2float(p);
}

extern "C" __global__ void bf_convert(SL_GLOBAL(const float) f, SL_GLOBAL(__nv_bfloat16) f2b,
                                      SL_GLOBAL(const __nv_bfloat16) b, SL_GLOBAL(float) b2f, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  f2b[i] = __float2bfloat16(f[i]);
  b2f[i] = __bfloat162float(b[i]);
}

extern "C" __global__ void bf_arith(SL_GLOBAL(const float) f, SL_GLOBAL(const __nv_bfloat16) ba,
                                    SL_GLOBAL(const __nv_bfloat16) bb, SL_GLOBAL(__nv_bfloat16) bsum,
                                    SL_GLOBAL(__nv_bfloat16) bprod, SL_GLOBAL(float) pair, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  bsum[i] = __hadd(ba[i], bb[i]);
  bprod[i] = __hmul(ba[i], bb[i]);
  __nv_bfloat162 p = __floats2bfloat162_rn(f[i], -f[i]);
  pair[2 * i] = __low2float(p);
  pair[2 * i + 1] = __high2float(p);
}
"""

# Each block reverses its chunk through dynamic shared memory carved into a float and an int view.
DYN_SMEM = r"""
extern "C" __global__ void dyn_reverse(SL_GLOBAL(const float) x, SL_GLOBAL(float) y, SL_GLOBAL(int) idx) {
  SL_DYN_SHARED(smem);
  const int n = blockDim.x;
  SL_SHARED_VIEW(float, vals, smem, 0, n);
  SL_SHARED_VIEW(int, ids, smem, n * sizeof(float), n);
  const int g = blockIdx.x * n + threadIdx.x;
  vals[threadIdx.x] = x[g];
  ids[threadIdx.x] = g;
  __syncthreads();
  y[g] = 2.0f * vals[n - 1 - threadIdx.x];
  idx[g] = ids[n - 1 - threadIdx.x];
}
"""

# y = 2x + 1 four floats at a time.
VEC4 = r"""
extern "C" __global__ void axpb4(SL_GLOBAL(const float) x, SL_GLOBAL(float) y, int n4) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  float4 v = SL_VLOAD(float4, x, 4 * i);
  v.x = 2.0f * v.x + 1.0f; v.y = 2.0f * v.y + 1.0f; v.z = 2.0f * v.z + 1.0f; v.w = 2.0f * v.w + 1.0f;
  SL_VSTORE(float4, y, 4 * i, v);
}
"""

# One warp computes D[16x8] = A[16x16] @ B[16x8] + C through cp.async, ldmatrix and mma.
# Variant "rk": A row-major [m][k] via ldmatrix.x4, B as [k][n] via ldmatrix.x2.trans.
# Variant "tn": A stored transposed [k][m] via ldmatrix.x4.trans, B as [n][k] via ldmatrix.x2.
_MMA_TEMPLATE = r"""
extern "C" __global__ void __launch_bounds__(32)
mma_{variant}_{tag}(SL_GLOBAL(const {T}) A, SL_GLOBAL(const {T}) B, SL_GLOBAL(const float) C, SL_GLOBAL(float) D) {{
  SL_SHARED({T}, As, 256);
  SL_SHARED({T}, Bs, 128);
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  sl_cp_async_16(&As[lane * 8], &A[lane * 8]);
  if (lane < 16) sl_cp_async_16(&Bs[lane * 8], &B[lane * 8]);
  sl_cp_async_commit();
  sl_cp_async_wait<0>();
  __syncthreads();
  unsigned a[4], b[2];
  const int i = lane / 8, r = lane % 8;
#if {trans_a}
  sl_ldmatrix_x4_trans(a, &As[(r + 8 * (i >> 1)) * 16 + 8 * (i & 1)]);
  sl_ldmatrix_x2(b, &Bs[r * 16 + 8 * (i & 1)]);
#else
  sl_ldmatrix_x4(a, &As[(r + 8 * (i & 1)) * 16 + 8 * (i >> 1)]);
  sl_ldmatrix_x2_trans(b, &Bs[(lane % 16) * 8]);
#endif
  float c[4], d[4];
  for (int e = 0; e < 4; ++e) c[e] = C[(g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1)];
  {mma}(d, a, b, c);
  for (int e = 0; e < 4; ++e) D[(g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1)] = d[e];
}}
"""


def mma_kernel(variant: str, dtype: str) -> str:
    """Kernel ``mma_<variant>_<f16|bf16>``; variant "rk" or "tn" (see above)."""
    T, mma = {"f16": ("__half", "sl_mma_m16n8k16_f16f32"), "bf16": ("__nv_bfloat16", "sl_mma_m16n8k16_bf16f32")}[dtype]
    return _MMA_TEMPLATE.format(variant=variant, tag=dtype, T=T, mma=mma, trans_a=int(variant == "tn"))


# Raw ldmatrix fragments: out[lane * 4 + j] = register j of lane (x4 / x4.trans of a 16x16 b16 tile).
LDMATRIX_RAW = r"""
extern "C" __global__ void ldm_raw(SL_GLOBAL(const unsigned short) M, SL_GLOBAL(unsigned) out,
                                   SL_GLOBAL(unsigned) out_t) {
  SL_SHARED(unsigned short, S, 256);
  const int lane = threadIdx.x;
  for (int e = lane; e < 256; e += 32) S[e] = M[e];
  __syncthreads();
  unsigned r[4];
  const int i = lane / 8, row = lane % 8;
  const unsigned short* p = &S[(row + 8 * (i & 1)) * 16 + 8 * (i >> 1)];
  sl_ldmatrix_x4(r, p);
  for (int j = 0; j < 4; ++j) out[lane * 4 + j] = r[j];
  sl_ldmatrix_x4_trans(r, p);
  for (int j = 0; j < 4; ++j) out_t[lane * 4 + j] = r[j];
}
"""

# mma from fragments given per lane in global memory (a: 4 words, b: 2 words per lane).
MMA_RAW = r"""
extern "C" __global__ void mma_raw(SL_GLOBAL(const unsigned) afrag, SL_GLOBAL(const unsigned) bfrag,
                                   SL_GLOBAL(const float) cfrag, SL_GLOBAL(float) dfrag) {
  const int lane = threadIdx.x;
  unsigned a[4], b[2];
  float c[4];
  for (int j = 0; j < 4; ++j) { a[j] = afrag[lane * 4 + j]; c[j] = cfrag[lane * 4 + j]; }
  for (int j = 0; j < 2; ++j) b[j] = bfrag[lane * 2 + j];
  sl_mma_m16n8k16_f16f32(c, a, b, c);
  for (int j = 0; j < 4; ++j) dfrag[lane * 4 + j] = c[j];
}
"""

# Every thread records its coordinates: checks the 3-D threadIdx/blockIdx/blockDim/gridDim mapping.
INDICES = r"""
extern "C" __global__ void indices(SL_GLOBAL(int) out) {
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int nt = blockDim.x * blockDim.y * blockDim.z;
  SL_GLOBAL(int) o = out + 6 * (b * nt + t);
  o[0] = threadIdx.x; o[1] = threadIdx.y; o[2] = threadIdx.z;
  o[3] = blockIdx.x; o[4] = blockIdx.y; o[5] = blockIdx.z;
}
"""

# Warp collectives with sub-warp widths, then block votes: out[10 * gtid + j], j in the order below.
WARP_OPS = r"""
extern "C" __global__ void warp_ops(SL_GLOBAL(int) out) {
  const int tid = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
  const int v = 1000 * (int)blockIdx.x + (int)threadIdx.x;
  SL_GLOBAL(int) o = out + 10 * tid;
  o[0] = __shfl_sync(0xffffffffu, v, lane + 3, 8);
  o[1] = __shfl_up_sync(0xffffffffu, v, 3, 8);
  o[2] = __shfl_down_sync(0xffffffffu, v, 5, 16);
  o[3] = __shfl_xor_sync(0xffffffffu, v, 3, 4);
  o[4] = __shfl_sync(0xffffffffu, v, 31 - lane);
  o[5] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
  o[6] = __any_sync(0xffffffffu, lane == 7) + 2 * __all_sync(0xffffffffu, lane < 32) +
         4 * __all_sync(0xffffffffu, lane < 31);
  __syncwarp();
  o[7] = __shfl_down_sync(0xffffffffu, (float)v * 0.5f, 1) * 2.0f;
  o[8] = __syncthreads_count(threadIdx.x % 5 == 0);
  o[9] = __syncthreads_and(threadIdx.x < 1000) + 2 * __syncthreads_or(threadIdx.x == 63) +
         4 * __syncthreads_and(threadIdx.x < 63);
}
"""

# float atomicAdd from many blocks (exercises several OS threads at once).
ATOMIC_SUM = r"""
extern "C" __global__ void atomic_sum(SL_GLOBAL(const float) x, SL_GLOBAL(float) total, SL_GLOBAL(int) count, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { atomicAdd(total, x[i]); atomicAdd(count, 1); }
}
"""

ALL_KERNELS = (VADD, MATMUL, ROWSUM, HALF_OPS, DYN_SMEM, VEC4, LDMATRIX_RAW, MMA_RAW, ATOMIC_SUM, INDICES, WARP_OPS,
               mma_kernel("rk", "f16"), mma_kernel("tn", "f16"), mma_kernel("rk", "bf16"), mma_kernel("tn", "bf16"))
