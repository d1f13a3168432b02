/**
 * @file topk.cu
 * @brief topk_log_softmax and eagle2_expand kernels, launchers and host twins (see topk.cuh).
 *
 * topk_log_softmax: one block of kTopkThreads per row. Each thread strides over the row keeping
 * its own sorted top-k list and log-sum-exp state (scan_slice); the block merges the states, then
 * takes k rounds of "largest head of any thread's list" (the owner pops its head). Keys are
 * unique, so exactly one thread pops per round.
 *
 * eagle2_expand: one block per tree. The K*C candidate keys go to shared memory; each candidate
 * counts the keys above it (its rank) and, if the rank is < top_k, writes itself to that slot.
 * O((K*C)^2 / threads) compares: ~80 per thread at EAGLE-2's K = C = 10.
 */
#include <algorithm>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "topk.cuh"

namespace eagle_kernels {
namespace {

using topk::LogSumExp;
using topk::kNoKey;

/// Largest key of the block, returned to every thread. scratch: >= 32 entries.
__device__ int64_t block_max_key(int64_t mine, int64_t* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int delta = 16; delta > 0; delta >>= 1) {
    mine = max(mine, static_cast<int64_t>(__shfl_down_sync(0xffffffffu, mine, delta)));
  }
  if (lane == 0) scratch[warp] = mine;
  __syncthreads();
  if (warp == 0) {
    mine = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : kNoKey;
    for (int delta = 16; delta > 0; delta >>= 1) {
      mine = max(mine, static_cast<int64_t>(__shfl_down_sync(0xffffffffu, mine, delta)));
    }
    if (lane == 0) scratch[0] = mine;
  }
  __syncthreads();
  const int64_t best = scratch[0];
  __syncthreads();  // scratch is reused by the next round
  return best;
}

/// Merged log-sum-exp of the block, returned to every thread. scratch: >= 32 entries.
__device__ LogSumExp block_lse(LogSumExp mine, LogSumExp* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int delta = 16; delta > 0; delta >>= 1) {
    const LogSumExp other{__shfl_down_sync(0xffffffffu, mine.max, delta),
                          __shfl_down_sync(0xffffffffu, mine.sum, delta)};
    mine = topk::lse_merge(mine, other);
  }
  if (lane == 0) scratch[warp] = mine;
  __syncthreads();
  if (warp == 0) {
    mine = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : topk::lse_empty();
    for (int delta = 16; delta > 0; delta >>= 1) {
      const LogSumExp other{__shfl_down_sync(0xffffffffu, mine.max, delta),
                            __shfl_down_sync(0xffffffffu, mine.sum, delta)};
      mine = topk::lse_merge(mine, other);
    }
    if (lane == 0) scratch[0] = mine;
  }
  __syncthreads();
  return scratch[0];
}

template <typename T>
__global__ void topk_log_softmax_kernel(const T* __restrict__ logits,
                                        const int64_t* __restrict__ d2t,
                                        float* __restrict__ values, int64_t* __restrict__ ids,
                                        int64_t vocab, int k) {
  __shared__ int64_t key_scratch[32];
  __shared__ LogSumExp lse_scratch[32];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  int64_t list[topk::kMaxK];
  for (int j = 0; j < k; ++j) list[j] = kNoKey;
  LogSumExp state = topk::lse_empty();
  topk::scan_slice(row, vocab, threadIdx.x, blockDim.x, k, list, state);
  state = block_lse(state, lse_scratch);

  float* row_values = values + static_cast<int64_t>(blockIdx.x) * k;
  int64_t* row_ids = ids + static_cast<int64_t>(blockIdx.x) * k;
  int head = 0;
  for (int j = 0; j < k; ++j) {
    const int64_t mine = head < k ? list[head] : kNoKey;
    const int64_t best = block_max_key(mine, key_scratch);
    if (mine == best) ++head;  // unique keys: only the owner (vocab >= k real keys exist)
    if (threadIdx.x == 0) {
      topk::write_winner(row, d2t, state, best, j, row_values, row_ids);
    }
  }
}

/// One row on the host: kTopkThreads simulated threads, then the same merge rounds.
template <typename T>
void topk_row_host(const T* row, const int64_t* d2t, int64_t vocab, int k, float* values,
                   int64_t* ids) {
  constexpr int kThreads = topk::kTopkThreads;
  std::vector<int64_t> lists(static_cast<size_t>(kThreads) * k, kNoKey);
  std::vector<int> heads(kThreads, 0);
  LogSumExp state = topk::lse_empty();
  for (int t = 0; t < kThreads; ++t) {
    LogSumExp mine = topk::lse_empty();
    topk::scan_slice(row, vocab, t, kThreads, k, &lists[size_t(t) * k], mine);
    state = topk::lse_merge(state, mine);
  }
  for (int j = 0; j < k; ++j) {
    int owner = 0;
    int64_t best = kNoKey;
    for (int t = 0; t < kThreads; ++t) {
      const int64_t mine = heads[t] < k ? lists[size_t(t) * k + heads[t]] : kNoKey;
      if (mine > best) best = mine, owner = t;
    }
    ++heads[owner];
    topk::write_winner(row, d2t, state, best, j, values, ids);
  }
}

template <typename T>
void launch_topk_typed(const void* logits, const int64_t* d2t, float* values, int64_t* ids,
                       int64_t rows, int64_t vocab, int k, cudaStream_t stream) {
  topk_log_softmax_kernel<T><<<static_cast<unsigned>(rows), topk::kTopkThreads, 0, stream>>>(
      static_cast<const T*>(logits), d2t, values, ids, vocab, k);
}

template <typename T>
void topk_host_typed(const void* logits, const int64_t* d2t, float* values, int64_t* ids,
                     int64_t rows, int64_t vocab, int k) {
  const T* data = static_cast<const T*>(logits);
  for (int64_t r = 0; r < rows; ++r) {
    topk_row_host(data + r * vocab, d2t, vocab, k, values + r * k, ids + r * k);
  }
}

// --------------------------------------------------------------------------------------------
// EAGLE-2 expansion
// --------------------------------------------------------------------------------------------

/// Rank-select one tree's candidates: keys must hold all `count` keys.
EK_HOST_DEVICE void expand_write(const float* frontier, const float* children, int64_t C,
                                 const int64_t* keys, int64_t count, int64_t i, int64_t top_k,
                                 int64_t* next_index, float* next_scores) {
  const int64_t rank = topk::key_rank(keys, count, keys[i]);
  if (rank >= top_k) return;
  next_index[rank] = i;
  next_scores[rank] = topk::expand_score(frontier, children, C, i);
}

__global__ void expand_kernel(const float* __restrict__ frontier,
                              const float* __restrict__ children, float* __restrict__ candidates,
                              int64_t* __restrict__ next_index, float* __restrict__ next_scores,
                              int64_t K, int64_t C, int64_t top_k) {
  extern __shared__ int64_t keys[];  // [K * C], padded to 16 bytes (shared_span)
  const int64_t tree = blockIdx.x;
  const int64_t count = K * C;
  const float* tree_frontier = frontier + tree * K;
  const float* tree_children = children + tree * count;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const float score = topk::expand_score(tree_frontier, tree_children, C, i);
    candidates[tree * count + i] = score;
    keys[i] = topk::order_key(score, i);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    expand_write(tree_frontier, tree_children, C, keys, count, i, top_k,
                 next_index + tree * top_k, next_scores + tree * top_k);
  }
}

}  // namespace

cudaError_t launch_topk_log_softmax(const void* logits, int dtype_code, const int64_t* d2t,
                                    float* values, int64_t* ids, int64_t rows, int64_t vocab,
                                    int64_t k, cudaStream_t stream) {
  if (topk::topk_size_error(rows, vocab, k, dtype_code) != nullptr) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int kk = static_cast<int>(k);
  dispatch_dtype(dtype_code, [&](auto tag) {
    launch_topk_typed<decltype(tag)>(logits, d2t, values, ids, rows, vocab, kk, stream);
  });
  return cudaGetLastError();
}

void topk_log_softmax_host(const void* logits, int dtype_code, const int64_t* d2t, float* values,
                           int64_t* ids, int64_t rows, int64_t vocab, int64_t k) {
  if (topk::topk_size_error(rows, vocab, k, dtype_code) != nullptr) return;  // bindings raise
  const int kk = static_cast<int>(k);
  dispatch_dtype(dtype_code, [&](auto tag) {
    topk_host_typed<decltype(tag)>(logits, d2t, values, ids, rows, vocab, kk);
  });
}

cudaError_t launch_eagle2_expand(const float* frontier, const float* children, float* candidates,
                                 int64_t* next_index, float* next_scores, int64_t batch,
                                 int64_t frontier_size, int64_t num_children, int64_t top_k,
                                 cudaStream_t stream) {
  if (topk::expand_size_error(batch, frontier_size, num_children, top_k) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0) return cudaSuccess;
  const int64_t count = frontier_size * num_children;
  const int threads = static_cast<int>(std::min<int64_t>(256, ceil_div(count, 32) * 32));
  const size_t shared_bytes = static_cast<size_t>(shared_span(count, sizeof(int64_t)));
  expand_kernel<<<static_cast<unsigned>(batch), threads, shared_bytes, stream>>>(
      frontier, children, candidates, next_index, next_scores, frontier_size, num_children,
      top_k);
  return cudaGetLastError();
}

void eagle2_expand_host(const float* frontier, const float* children, float* candidates,
                        int64_t* next_index, float* next_scores, int64_t batch,
                        int64_t frontier_size, int64_t num_children, int64_t top_k) {
  if (topk::expand_size_error(batch, frontier_size, num_children, top_k) != nullptr) return;
  const int64_t count = frontier_size * num_children;
  std::vector<int64_t> keys(count);
  for (int64_t b = 0; b < batch; ++b) {
    const float* tree_frontier = frontier + b * frontier_size;
    const float* tree_children = children + b * count;
    for (int64_t i = 0; i < count; ++i) {
      const float score = topk::expand_score(tree_frontier, tree_children, num_children, i);
      candidates[b * count + i] = score;
      keys[i] = topk::order_key(score, i);
    }
    for (int64_t i = 0; i < count; ++i) {
      expand_write(tree_frontier, tree_children, num_children, keys.data(), count, i, top_k,
                   next_index + b * top_k, next_scores + b * top_k);
    }
  }
}

}  // namespace eagle_kernels
