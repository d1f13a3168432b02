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

#include <cuda_runtime.h>

#if defined(__CUDACC__)
#define EK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define EK_HOST_DEVICE inline
#endif

namespace eagle_kernels {

/// ceil(a / b) for positive b.
EK_HOST_DEVICE int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Bits per packed tree-mask word: node j is bit (j % 32) of word (j / 32).
constexpr int kMaskWordBits = 32;

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
