/**
 * @file topk.cuh
 * @brief Fused log-softmax + top-k over vocabulary rows, and the EAGLE-2 expansion step.
 *
 * Contracts: eagle_kernels.ops.reference.topk_log_softmax and .eagle2_expand.
 *
 *   topk_log_softmax: logits [R, V] (fp32 / fp16 / bf16, dtype_code 0 / 1 / 2), optional d2t [V]
 *                     int64 -> values [R, k] float32 (descending), ids [R, k] int64
 *   eagle2_expand:    frontier [B, K] f32, children [B, K, C] f32 -> candidates [B, K*C] f32,
 *                     next_index [B, top_k] int64, next_scores [B, top_k] f32
 *
 * Ordering: every value v at index i becomes one int64 key (order_key): unique, larger value
 * first, lower index on ties, -0.0 == 0.0, NaN above +inf (torch.sort's order). "Top k" is then
 * a question about distinct integers, so every thread count and reduction order gives the same
 * ids. topk_log_softmax ranks by the logit, exactly like the reference (which ranks by the
 * logit, not by the rounded log-prob that could merge two different logits), so ids match the
 * reference exactly; log-probs match to a few ulps (see eagle_kernels/ops/topk.py).
 *
 * The per-thread and per-candidate functions are EK_HOST_DEVICE: the *_host entry points run
 * the kernels' code on CPU pointers (simulating kTopkThreads threads for topk_log_softmax).
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "common.cuh"

namespace eagle_kernels {
namespace topk {

constexpr int kMaxK = 32;             ///< largest k of topk_log_softmax (per-thread list)
constexpr int kTopkThreads = 256;     ///< threads per row of topk_log_softmax
constexpr int64_t kMaxExpand = 6144;  ///< largest K * C of eagle2_expand (int64 keys, 48 KiB)
constexpr int64_t kNoKey = INT64_MIN + 1;  ///< below every real key

/// Unique ordering key of value `value` at `index` (0 <= index < 2^31); see the file comment.
EK_HOST_DEVICE int64_t order_key(float value, int64_t index) {
  const uint64_t high = static_cast<uint64_t>(static_cast<int64_t>(ordered_bits(value))) << 32;
  return static_cast<int64_t>(high | static_cast<uint64_t>(0x7fffffff - index));
}

/// Index stored in the low word of an order_key.
EK_HOST_DEVICE int64_t key_index(int64_t key) { return 0x7fffffff - (key & 0xffffffff); }

/// Number of keys in keys[0, n) larger than `key`: its 0-based rank, best first.
EK_HOST_DEVICE int64_t key_rank(const int64_t* keys, int64_t n, int64_t key) {
  int64_t rank = 0;
  for (int64_t j = 0; j < n; ++j) rank += keys[j] > key;
  return rank;
}

/// Insert `key` into list[0, k), sorted descending with unique keys; the smallest drops out.
EK_HOST_DEVICE void list_insert(int64_t* list, int k, int64_t key) {
  if (key <= list[k - 1]) return;
  int j = k - 1;
  for (; j > 0 && list[j - 1] < key; --j) list[j] = list[j - 1];
  list[j] = key;
}

/// Running log-sum-exp: sum of exp(x - max) over the values seen.
struct LogSumExp {
  float max;
  float sum;
};

EK_HOST_DEVICE LogSumExp lse_empty() { return {-INFINITY, 0.0f}; }

/// Add one value (-inf adds nothing; a new maximum rescales the sum).
EK_HOST_DEVICE void lse_add(LogSumExp& state, float x) {
  if (x == -INFINITY) return;
  if (x > state.max) {
    state.sum = state.sum * expf(state.max - x) + 1.0f;  // expf(-inf) == 0 on the first value
    state.max = x;
  } else {
    state.sum += expf(x - state.max);
  }
}

/// Combine two partial states.
EK_HOST_DEVICE LogSumExp lse_merge(LogSumExp a, LogSumExp b) {
  if (a.max < b.max) {
    const LogSumExp t = a;
    a = b;
    b = t;
  }
  if (b.max == -INFINITY) return a;
  return {a.max, a.sum + b.sum * expf(b.max - a.max)};
}

/// One thread's share of a row: elements first, first + stride, ... into its list and state.
template <typename T>
EK_HOST_DEVICE void scan_slice(const T* row, int64_t vocab, int64_t first, int64_t stride,
                               int k, int64_t* list, LogSumExp& state) {
  int64_t floor = list[k - 1];  // in a register: most elements lose to it
  for (int64_t i = first; i < vocab; i += stride) {
    const float x = to_float(row[i]);
    lse_add(state, x);
    const int64_t key = order_key(x, i);
    if (key > floor) {
      list_insert(list, k, key);
      floor = list[k - 1];
    }
  }
}

/// Output slot j of a row from the winning key: the log-prob in torch's order of operations,
/// (x - max) - log(sum), and the (d2t-mapped) id.
template <typename T>
EK_HOST_DEVICE void write_winner(const T* row, const int64_t* d2t, LogSumExp state, int64_t key,
                                 int j, float* values, int64_t* ids) {
  const int64_t id = key_index(key);
  values[j] = (to_float(row[id]) - state.max) - logf(state.sum);
  ids[j] = d2t != nullptr ? id + d2t[id] : id;
}

/// Candidate i of one tree in eagle2_expand: frontier[i / C] + children[i] (one fp32 add,
/// bit-equal to the reference's broadcast add).
EK_HOST_DEVICE float expand_score(const float* frontier, const float* children, int64_t C,
                                  int64_t i) {
  return frontier[i / C] + children[i];
}

inline const char* topk_size_error(int64_t rows, int64_t vocab, int64_t k, int dtype_code) {
  if (rows < 0 || rows > INT32_MAX) return "topk_log_softmax: rows must be in [0, 2^31)";
  if (vocab < 1 || vocab > INT32_MAX) return "topk_log_softmax: vocab must be in [1, 2^31)";
  if (k < 1 || k > vocab || k > kMaxK) {
    return "topk_log_softmax: k must be in [1, min(vocab, 32)] for the cuda backend";
  }
  if (dtype_code < kFloat32 || dtype_code > kBFloat16) {
    return "topk_log_softmax: dtype_code must be 0 (float32), 1 (float16) or 2 (bfloat16)";
  }
  return nullptr;
}

inline const char* expand_size_error(int64_t batch, int64_t frontier, int64_t children,
                                     int64_t top_k) {
  if (batch < 0 || batch > INT32_MAX) return "eagle2_expand: batch must be in [0, 2^31)";
  if (frontier < 1 || children < 1 || frontier * children > kMaxExpand) {
    return "eagle2_expand: K * C must be in [1, 6144] for the cuda backend";
  }
  if (top_k < 1 || top_k > frontier * children) return "eagle2_expand: top_k must be in [1, K*C]";
  return nullptr;
}

}  // namespace topk

/// Queue topk_log_softmax on `stream` (device pointers; d2t may be nullptr).
cudaError_t launch_topk_log_softmax(const void* logits, int dtype_code, const int64_t* d2t,
                                    float* values, int64_t* ids, int64_t rows, int64_t vocab,
                                    int64_t k, cudaStream_t stream);

/// topk_log_softmax on host pointers, synchronously (the CPU check of the kernel).
void topk_log_softmax_host(const void* logits, int dtype_code, const int64_t* d2t, float* values,
                           int64_t* ids, int64_t rows, int64_t vocab, int64_t k);

/// Queue eagle2_expand on `stream` (device pointers).
cudaError_t launch_eagle2_expand(const float* frontier, const float* children, float* candidates,
                                 int64_t* next_index, float* next_scores, int64_t batch,
                                 int64_t frontier_size, int64_t num_children, int64_t top_k,
                                 cudaStream_t stream);

/// eagle2_expand on host pointers, synchronously.
void eagle2_expand_host(const float* frontier, const float* children, float* candidates,
                        int64_t* next_index, float* next_scores, int64_t batch,
                        int64_t frontier_size, int64_t num_children, int64_t top_k);

}  // namespace eagle_kernels
