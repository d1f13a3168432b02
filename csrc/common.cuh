/**
 * @file common.cuh
 * @brief Small helpers shared by the eagle_kernels CUDA kernels (torch-free).
 *
 * Everything marked EK_HOST_DEVICE compiles for both the host and the device: the per-tree and
 * per-path logic of every kernel is written once in such functions, so the host entry points
 * (which CI runs without a GPU) execute exactly the code the kernels execute.
 */
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#if defined(__CUDACC__)
#define EK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define EK_HOST_DEVICE inline
#endif

namespace eagle_kernels {

/// ceil(a / b) for positive b.
EK_HOST_DEVICE int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Bytes of one array of `count` elements of `element_bytes` in dynamic shared memory, rounded
/// up to 16. nvcc reads the tail of an unrolled loop over such an array with 16-byte loads
/// (LDS.128) and discards the half past the last element (seen in eagle2_expand's rank count
/// on sm_90a: compute-sanitizer memcheck reported the read past an odd count of int64 keys).
/// Each array starting and ending on a 16-byte boundary keeps those reads inside the block's
/// allocation (the dynamic shared-memory base is 16-byte aligned).
EK_HOST_DEVICE int64_t shared_span(int64_t count, int64_t element_bytes) {
  return ceil_div(count * element_bytes, 16) * 16;
}

/// Bits per packed tree-mask word: node j is bit (j % 32) of word (j / 32).
constexpr int kMaskWordBits = 32;

/// Logit dtypes the kernels read, as the codes Python passes (ops/sampling.py LOGIT_DTYPE_CODES).
enum DtypeCode : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

/// Widening to float: exact for all three dtypes, so comparing the floats orders the logits
/// exactly as comparing them in their own dtype would.
EK_HOST_DEVICE float to_float(float value) { return value; }
EK_HOST_DEVICE float to_float(__half value) { return __half2float(value); }
EK_HOST_DEVICE float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }

/**
 * @brief Call `fn(tag)` with a value of the C++ type of `dtype_code` (float, __half or
 *        __nv_bfloat16), so one generic lambda covers the three instantiations. Callers have
 *        validated the code already; anything past kFloat16 is treated as bfloat16.
 */
template <typename Fn>
inline void dispatch_dtype(int dtype_code, Fn fn) {
  switch (dtype_code) {
    case kFloat32: fn(float{}); break;
    case kFloat16: fn(__half{}); break;
    default: fn(__nv_bfloat16{}); break;
  }
}

/// The bit pattern of an fp32 value, and back.
EK_HOST_DEVICE int32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(x);
#else
  int32_t bits;
  __builtin_memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

EK_HOST_DEVICE float bits_float(int32_t bits) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#else
  float x;
  __builtin_memcpy(&x, &bits, sizeof(x));
  return x;
#endif
}

/**
 * @brief fp32 -> int32 that orders like the float: sign-magnitude bits turned into two's
 *        complement order, -0.0 equal to +0.0, every NaN above +inf (as torch's sort puts it).
 *        Integer comparison of these keys is float comparison, so searches and top-k can work
 *        on exact integer keys.
 */
EK_HOST_DEVICE int32_t ordered_bits(float x) {
  if (x != x) return INT32_MAX;
  const int32_t bits = x == 0.0f ? 0 : float_bits(x);
  return bits ^ ((bits >> 31) & 0x7fffffff);
}

/**
 * @brief A (key, index) pair competing in a "best of" reduction.
 *
 * Reductions use a total order (see the comparators below), so the winner does not depend on
 * the order in which threads and warps combine their candidates: GPU and host agree exactly.
 */
template <typename Key>
struct Candidate {
  Key key;
  int64_t index;
};

/// Largest float wins, NaN beats every number (like torch.argmax); ties: lowest index.
struct LargerFloatFirst {
  EK_HOST_DEVICE bool operator()(const Candidate<float>& a, const Candidate<float>& b) const {
    const bool a_nan = a.key != a.key;
    const bool b_nan = b.key != b.key;
    if (a_nan || b_nan) return a_nan && (!b_nan || a.index < b.index);
    return a.key > b.key || (a.key == b.key && a.index < b.index);
  }
};

/// Largest integer wins; ties: lowest index.
struct LargerIntFirst {
  EK_HOST_DEVICE bool operator()(const Candidate<int>& a, const Candidate<int>& b) const {
    return a.key > b.key || (a.key == b.key && a.index < b.index);
  }
};

#if defined(__CUDACC__)

/// Shuffle a candidate down the warp (both fields).
template <typename Key>
__device__ __forceinline__ Candidate<Key> shfl_down(const Candidate<Key>& c, int delta) {
  Candidate<Key> other;
  other.key = __shfl_down_sync(0xffffffffu, c.key, delta);
  other.index = __shfl_down_sync(0xffffffffu, c.index, delta);
  return other;
}

/// Best candidate of the warp, valid in lane 0.
template <typename Key, typename Better>
__device__ __forceinline__ Candidate<Key> warp_best(Candidate<Key> mine, Better better) {
  for (int delta = 16; delta > 0; delta >>= 1) {
    const Candidate<Key> other = shfl_down(mine, delta);
    if (better(other, mine)) mine = other;
  }
  return mine;
}

/**
 * @brief Best candidate of the whole block, returned to every thread.
 *
 * @param scratch shared memory for at least 32 candidates. blockDim.x must be a multiple of 32
 *        (every lane takes part in the shuffles). Contains __syncthreads(): call it from all
 *        threads of the block.
 */
template <typename Key, typename Better>
__device__ Candidate<Key> block_best(Candidate<Key> mine, Better better,
                                     Candidate<Key>* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  mine = warp_best(mine, better);
  if (lane == 0) scratch[warp] = mine;
  __syncthreads();
  if (warp == 0) {
    mine = scratch[lane < num_warps ? lane : 0];  // lanes past the warp count repeat warp 0
    mine = warp_best(mine, better);
    if (lane == 0) scratch[0] = mine;
  }
  __syncthreads();
  const Candidate<Key> best = scratch[0];
  __syncthreads();  // scratch may be reused right after
  return best;
}

#endif  // __CUDACC__

}  // namespace eagle_kernels
