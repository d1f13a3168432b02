/**
 * @file sampling.cuh
 * @brief Sort-free target sampling distribution and stochastic acceptance (CUDA backends).
 *
 * Contracts: eagle_kernels.ops.reference.target_probs / sample_from_probs /
 * stochastic_accept_tree / stochastic_accept_chain. Same algorithm as the Triton backend
 * (eagle_kernels/ops/sampling.py), per row of logits [R, V] (s = logit / temperature, fp32):
 *
 *   m     row max of s;
 *   kkey  order key of the k-th largest s (32-step binary search over int32 order keys,
 *         each step counting key(s) >= mid): key(s) >= kkey is the tie-inclusive top-k;
 *   tau   smallest e = exp(s - m) (top-k kept) with mass(e' > tau) < top_p * Z_k (30-step
 *         binary search over the bit patterns of non-negative floats): e >= tau is the
 *         reference's top-p rule (ties kept);
 *   z     sum of e over the kept set: p(x) = e(x) / z, any token in O(1).
 *
 * Sampling parameters are per-row device arrays: temperature [P] float32, top_k [P] int32
 * (0 disables, already clamped to <= V), top_p [P] float32 (>= 1 disables); row r uses entry
 * r / rows_per_param. Acceptance kernels run one block per sequence: the node probabilities
 * are gathered in parallel, thread 0 walks the tree / chain, and the bonus token is drawn by a
 * block-wide inverse CDF (contiguous segment per thread, exclusive scan of segment sums).
 *
 * All per-row / per-sequence logic is in EK_HOST_DEVICE functions over a `Block` (the CUDA
 * block on the device; one "thread" on the host), so the *_host entry points run the kernels'
 * own code on CPU pointers. fp32 arithmetic differs from the reference's fp64 only by rounding.
 */
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"

namespace eagle_kernels {
namespace sampling {

/// Per-row statistics (see the file comment).
struct RowStats {
  float m;
  int32_t kkey;
  float tau;
  float z;
};

/// e = exp(s - m) on the kept set of the row, 0 elsewhere.
EK_HOST_DEVICE float kept_e(float s, const RowStats& st) {
  const float e = expf(s - st.m);
  return (ordered_bits(s) >= st.kkey && e >= st.tau) ? e : 0.0f;
}

/**
 * @brief Block-wide reductions: the whole CUDA block on the device (every thread must call,
 *        blockDim.x a multiple of 32, `scratch` >= 33 shared 8-byte words), a single thread on
 *        the host. `tid` / `threads` give each caller its share of a strided loop.
 */
struct Block {
  int tid;
  int threads;
  int64_t* scratch;

  template <typename T, typename Op>
  EK_HOST_DEVICE T reduce(T v, Op op) const {
#if defined(__CUDA_ARCH__)
    T* shared = reinterpret_cast<T*>(scratch);
    for (int delta = 16; delta > 0; delta >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, delta));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
      v = shared[lane < warps ? lane : 0];
      for (int delta = 16; delta > 0; delta >>= 1) {
        const T other = __shfl_down_sync(0xffffffffu, v, delta);
        if (lane + delta < warps) v = op(v, other);
      }
      if (lane == 0) shared[32] = v;
    }
    __syncthreads();
    const T out = shared[32];
    __syncthreads();
    return out;
#else
    (void)op;
    return v;
#endif
  }

  /// Block barrier (a no-op on the host).
  EK_HOST_DEVICE void sync() const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }

  EK_HOST_DEVICE float sum(float v) const { return reduce(v, Add<float>()); }
  EK_HOST_DEVICE int64_t count(int64_t v) const { return reduce(v, Add<int64_t>()); }
  EK_HOST_DEVICE float max(float v) const { return reduce(v, Max<float>()); }
  EK_HOST_DEVICE int64_t min(int64_t v) const { return reduce(v, Min<int64_t>()); }
  EK_HOST_DEVICE int64_t maxi(int64_t v) const { return reduce(v, Max<int64_t>()); }

  /// Sum of v over the threads before this one (in tid order); *total gets the block sum.
  EK_HOST_DEVICE float exclusive_sum(float v, float* total) const {
#if defined(__CUDA_ARCH__)
    float* shared = reinterpret_cast<float*>(scratch);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float inclusive = v;
    for (int delta = 1; delta < 32; delta <<= 1) {
      const float other = __shfl_up_sync(0xffffffffu, inclusive, delta);
      if (lane >= delta) inclusive += other;
    }
    float exclusive = __shfl_up_sync(0xffffffffu, inclusive, 1);
    if (lane == 0) exclusive = 0.0f;
    if (lane == 31) shared[warp] = inclusive;
    __syncthreads();
    if (threadIdx.x == 0) {
      float running = 0.0f;
      for (int w = 0; w < warps; ++w) {
        const float warp_sum = shared[w];
        shared[w] = running;
        running += warp_sum;
      }
      shared[32] = running;
    }
    __syncthreads();
    const float before = shared[warp] + exclusive;
    *total = shared[32];
    __syncthreads();
    return before;
#else
    *total = v;
    return 0.0f;
#endif
  }

  template <typename T>
  struct Add {
    EK_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
  };
  template <typename T>
  struct Max {
    EK_HOST_DEVICE T operator()(T a, T b) const { return a > b ? a : b; }
  };
  template <typename T>
  struct Min {
    EK_HOST_DEVICE T operator()(T a, T b) const { return a < b ? a : b; }
  };
};

/// Sum over the row of f(i, s_i), s_i = logit_i / t (block-wide).
template <typename T, typename F>
EK_HOST_DEVICE float row_sum(const Block& block, const T* row, int64_t vocab, float t, F f) {
  float acc = 0.0f;
  for (int64_t i = block.tid; i < vocab; i += block.threads) acc += f(to_float(row[i]) / t);
  return block.sum(acc);
}

/// (m, kkey, tau, z) of one row; top_k already clamped to <= vocab (0 disables).
template <typename T>
EK_HOST_DEVICE RowStats row_stats(const Block& block, const T* row, int64_t vocab, float t,
                                  int top_k, float top_p) {
  RowStats st{-INFINITY, INT32_MIN, 0.0f, 0.0f};
  float best = -INFINITY;
  for (int64_t i = block.tid; i < vocab; i += block.threads) {
    best = fmaxf(best, to_float(row[i]) / t);
  }
  st.m = block.max(best);
  if (top_k > 0) {
    int64_t lo = INT32_MIN, hi = INT32_MAX;  // largest key t with #(key >= t) >= k
    for (int step = 0; step < 32; ++step) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      int64_t count = 0;
      for (int64_t i = block.tid; i < vocab; i += block.threads) {
        count += ordered_bits(to_float(row[i]) / t) >= mid;
      }
      count = block.count(count);
      if (count >= top_k) lo = mid; else hi = mid - 1;
    }
    st.kkey = static_cast<int32_t>(lo);
  }
  if (top_p < 1.0f) {
    const RowStats top_k_only = st;  // tau = 0: every top-k-kept token
    const float budget = top_p * row_sum(block, row, vocab, t, [&](float s) {
      return kept_e(s, top_k_only);
    });
    int32_t lo = 0, hi = 0x3F800000;  // mass(e > 1.0) = 0 < budget
    for (int step = 0; step < 30; ++step) {
      const int32_t mid = (lo + hi) / 2;
      const float threshold = bits_float(mid);
      const float above = row_sum(block, row, vocab, t, [&](float s) {
        const float e = kept_e(s, top_k_only);
        return e > threshold ? e : 0.0f;
      });
      if (above < budget) hi = mid; else lo = mid + 1;
    }
    st.tau = bits_float(lo);
  }
  st.z = row_sum(block, row, vocab, t, [&](float s) { return kept_e(s, st); });
  return st;
}

/// p(token) of a row from its stats.
template <typename T>
EK_HOST_DEVICE float token_prob(const T* row, int64_t token, float t, const RowStats& st) {
  return kept_e(to_float(row[token]) / t, st) / st.z;
}

/// p(token) for a token that may lie outside [0, vocab) (tree / chain tokens are addresses
/// here, and with the Python value checks off nothing else stops them): 0 there, nothing read.
template <typename T>
EK_HOST_DEVICE float token_prob_checked(const T* row, int64_t vocab, int64_t token, float t,
                                        const RowStats& st) {
  return token >= 0 && token < vocab ? token_prob(row, token, t, st) : 0.0f;
}

/**
 * @brief Inverse-CDF draw (block-wide) from the residual r = p, minus q clamped at 0 when q is
 *        given, with the `num_removed` tokens of `removed` zeroed; a residual of total 0
 *        (round-off only) falls back to p. First index whose running sum exceeds u * total
 *        (strict: never a zero-probability token), else the last positive token.
 */
template <typename T>
EK_HOST_DEVICE int64_t sample_row(const Block& block, const T* row, int64_t vocab, float t,
                                  const RowStats& st, const float* q, const int64_t* removed,
                                  int num_removed, float u) {
  const int64_t per_thread = (vocab + block.threads - 1) / block.threads;
  const int64_t begin = block.tid * per_thread < vocab ? block.tid * per_thread : vocab;
  const int64_t end = begin + per_thread < vocab ? begin + per_thread : vocab;
  auto residual = [&](int64_t i, bool use_r) {
    const float p = token_prob(row, i, t, st);
    if (!use_r) return p;
    float r = q != nullptr ? fmaxf(p - q[i], 0.0f) : p;
    for (int j = 0; j < num_removed; ++j) r = removed[j] == i ? 0.0f : r;
    return r;
  };
  float mine = 0.0f;
  for (int64_t i = begin; i < end; ++i) mine += residual(i, true);
  const bool use_r = block.sum(mine) > 0.0f;
  if (!use_r) {
    mine = 0.0f;
    for (int64_t i = begin; i < end; ++i) mine += residual(i, false);
  }
  float total = 0.0f;
  float running = block.exclusive_sum(mine, &total);
  const float threshold = u * total;
  int64_t first = INT64_MAX, last = -1;
  for (int64_t i = begin; i < end; ++i) {
    const float r = residual(i, use_r);
    if (r > 0.0f) {
      running += r;
      last = i;
      if (first == INT64_MAX && running > threshold) first = i;
    }
  }
  first = block.min(first);
  last = block.maxi(last);
  const int64_t pick = first < last ? first : last;  // past-the-end round-off: last positive
  return pick >= 0 ? pick : 0;
}

/**
 * @brief Tree walk of one sequence (one thread): children of the current node in ascending
 *        index; child x accepted iff u * (1 - removed mass) < p(x), else p(x) is removed (a
 *        token already removed is rejected outright). Writes output_tokens[0, accepted) and
 *        accepted_nodes[1, accepted] (the caller prefills -1 and sets accepted_nodes[0] = 0),
 *        the removed tokens of the final node, and returns the accepted count.
 *
 * @param probs  [N] p(token of node i) under its parent's distribution (probs[0] unused)
 */
EK_HOST_DEVICE int tree_walk(const int64_t* tokens, const int32_t* parents,
                             const float* uniforms, const float* probs, int num_nodes,
                             int width, int64_t* output_tokens, int32_t* accepted_nodes,
                             int64_t* removed, int* num_removed, int* final_node) {
  int cur = 0, accepted = 0, count = 0;
  float removed_mass = 0.0f;
  for (int i = 1; i < num_nodes; ++i) {
    if (parents[i] != cur) continue;
    const int64_t token = tokens[i];
    bool gone = false;
    for (int j = 0; j < count; ++j) gone = gone || removed[j] == token;
    if (gone) continue;
    if (uniforms[i] * (1.0f - removed_mass) < probs[i]) {
      if (accepted + 1 >= width) break;  // deeper than max_depth: outside the contract
      output_tokens[accepted] = token;
      accepted_nodes[++accepted] = i;
      cur = i;
      count = 0;
      removed_mass = 0.0f;
    } else {
      removed[count++] = token;
      removed_mass += probs[i];
    }
  }
  *num_removed = count;
  *final_node = cur;
  return accepted;
}

/**
 * @brief Chain walk of one sequence (one thread): node i accepted iff u * q(x) < p(x); the
 *        first rejection at node i sets *bonus_row = i - 1 and *use_q, else *bonus_row = N - 1.
 *
 * @param probs, draft  [N] p(x_i) under node i - 1's target, q(x_i) (entry 0 unused)
 */
EK_HOST_DEVICE int chain_walk(const int64_t* tokens, const float* uniforms, const float* probs,
                              const float* draft, int num_nodes, int64_t* output_tokens,
                              int32_t* accepted_nodes, int* bonus_row, bool* use_q) {
  *bonus_row = num_nodes - 1;
  *use_q = false;
  int accepted = 0;
  for (int i = 1; i < num_nodes; ++i) {
    if (uniforms[i] * draft[i] < probs[i]) {
      output_tokens[accepted] = tokens[i];
      accepted_nodes[++accepted] = i;
    } else {
      *bonus_row = i - 1;
      *use_q = true;
      break;
    }
  }
  return accepted;
}

/// Largest tree / chain the acceptance kernels take (per-node shared memory).
constexpr int64_t kMaxNodes = 2048;

/// Why these sizes cannot run, or nullptr when they can (bindings raise ValueError).
inline const char* size_error(int64_t rows, int64_t vocab, int dtype_code) {
  if (rows < 0 || rows > INT32_MAX) return "sampling: rows must be in [0, 2^31)";
  if (vocab < 1 || vocab > INT32_MAX) return "sampling: vocab must be in [1, 2^31)";
  if (dtype_code < kFloat32 || dtype_code > kBFloat16) {
    return "sampling: dtype_code must be 0 (float32), 1 (float16) or 2 (bfloat16)";
  }
  return nullptr;
}

inline const char* accept_size_error(int64_t batch, int64_t num_nodes, int64_t vocab,
                                     int64_t width, int dtype_code) {
  if (num_nodes < 1 || num_nodes > kMaxNodes) {
    return "stochastic acceptance: num_nodes must be in [1, 2048]";
  }
  if (width < 1 || width > INT32_MAX) return "stochastic acceptance: width must be in [1, 2^31)";
  if (batch < 0 || batch * num_nodes > INT32_MAX) {
    return "stochastic acceptance: batch * num_nodes must be in [0, 2^31)";
  }
  return size_error(batch * num_nodes, vocab, dtype_code);
}

}  // namespace sampling

/**
 * @brief Row stats of logits [rows, vocab] (one block per row, on `stream`): m, kkey, tau, z
 *        [rows] (float32, int32, float32, float32); parameters [rows / rows_per_param].
 */
cudaError_t launch_row_stats(const void* logits, float* m, int32_t* kkey, float* tau, float* z,
                             const float* temperature, const int32_t* top_k,
                             const float* top_p, int64_t rows, int64_t vocab,
                             int64_t rows_per_param, int dtype_code, cudaStream_t stream);

/// target_probs: out [rows, vocab] float32 (one block per row; parameters [rows]).
cudaError_t launch_target_probs(const void* logits, float* out, const float* temperature,
                                const int32_t* top_k, const float* top_p, int64_t rows,
                                int64_t vocab, int dtype_code, cudaStream_t stream);

/**
 * @brief Stochastic tree acceptance (one block per sequence) given the row stats of every
 *        node row [B * N]. tokens [B, N] int64, parents [B, N] int32, accept_u [B, N],
 *        bonus_u [B], temperature [B] -> output_tokens [B, W] int64, num_accepted [B] int32,
 *        accepted_nodes [B, W] int32.
 */
cudaError_t launch_stochastic_accept_tree(
    const int64_t* tokens, const int32_t* parents, const void* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int64_t batch, int64_t num_nodes, int64_t vocab, int64_t width,
    int dtype_code, cudaStream_t stream);

/// Stochastic chain acceptance; draft_probs [B, N - 1, V] float32, widths N.
cudaError_t launch_stochastic_accept_chain(
    const int64_t* tokens, const float* draft_probs, const void* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int64_t batch, int64_t num_nodes, int64_t vocab, int dtype_code,
    cudaStream_t stream);

/// Host twins (CPU pointers, synchronous): the kernels' per-row / per-sequence code.
void row_stats_host(const void* logits, float* m, int32_t* kkey, float* tau, float* z,
                    const float* temperature, const int32_t* top_k, const float* top_p,
                    int64_t rows, int64_t vocab, int64_t rows_per_param, int dtype_code);
void target_probs_host(const void* logits, float* out, const float* temperature,
                       const int32_t* top_k, const float* top_p, int64_t rows, int64_t vocab,
                       int dtype_code);
void stochastic_accept_tree_host(
    const int64_t* tokens, const int32_t* parents, const void* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int64_t batch, int64_t num_nodes, int64_t vocab, int64_t width,
    int dtype_code);
void stochastic_accept_chain_host(
    const int64_t* tokens, const float* draft_probs, const void* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int64_t batch, int64_t num_nodes, int64_t vocab, int dtype_code);

}  // namespace eagle_kernels
