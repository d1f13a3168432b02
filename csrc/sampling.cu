/**
 * @file sampling.cu
 * @brief row_stats, target_probs and stochastic tree / chain acceptance kernels, launchers and
 *        host entry points (see sampling.cuh for the algorithm and shapes).
 */
#include <algorithm>
#include <cstdint>

#include "sampling.cuh"

namespace eagle_kernels {
namespace {

using sampling::Block;
using sampling::RowStats;

EK_HOST_DEVICE RowStats load_stats(const float* m, const int32_t* kkey, const float* tau,
                                   const float* z, int64_t row) {
  return RowStats{m[row], kkey[row], tau[row], z[row]};
}

/// Stats of row `row` into the four arrays (thread 0 writes).
template <typename T>
EK_HOST_DEVICE void row_stats_at(const Block& block, const T* logits, float* m, int32_t* kkey,
                                 float* tau, float* z, const float* temperature,
                                 const int32_t* top_k, const float* top_p, int64_t row,
                                 int64_t vocab, int64_t rows_per_param) {
  const int64_t index = row / rows_per_param;
  const RowStats st = sampling::row_stats(block, logits + row * vocab, vocab, temperature[index],
                                          top_k[index], top_p[index]);
  if (block.tid == 0) {
    m[row] = st.m;
    kkey[row] = st.kkey;
    tau[row] = st.tau;
    z[row] = st.z;
  }
}

/// target_probs of row `row`: stats, then p = kept e / z for every token.
template <typename T>
EK_HOST_DEVICE void target_probs_at(const Block& block, const T* logits, float* out,
                                    const float* temperature, const int32_t* top_k,
                                    const float* top_p, int64_t row, int64_t vocab) {
  const T* data = logits + row * vocab;
  const float t = temperature[row];
  const RowStats st = sampling::row_stats(block, data, vocab, t, top_k[row], top_p[row]);
  for (int64_t i = block.tid; i < vocab; i += block.threads) {
    out[row * vocab + i] = sampling::token_prob(data, i, t, st);
  }
}

/**
 * @brief Stochastic tree acceptance of sequence b. Shared per-sequence buffers: probs [N],
 *        removed [N], state [3].
 */
template <typename T>
EK_HOST_DEVICE void accept_tree_at(
    const Block& block, const int64_t* tokens, const int32_t* parents, const T* logits,
    const float* accept_u, const float* bonus_u, const float* m, const int32_t* kkey,
    const float* tau, const float* z, const float* temperature, int64_t* output_tokens,
    int32_t* num_accepted, int32_t* accepted_nodes, int64_t b, int num_nodes, int64_t vocab,
    int width, float* probs, int64_t* removed, int* state) {
  const int64_t seq = b * num_nodes;
  const float t = temperature[b];
  for (int i = block.tid; i < num_nodes; i += block.threads) {
    // A parent outside [0, i) is never the walk's current node (always < i), so its row is never
    // needed: skip it rather than address another sequence's (or no) row.
    const int parent = i > 0 ? parents[seq + i] : -1;
    probs[i] = parent >= 0 && parent < i
                   ? sampling::token_prob_checked(logits + (seq + parent) * vocab, vocab,
                                                  tokens[seq + i], t,
                                                  load_stats(m, kkey, tau, z, seq + parent))
                   : 0.0f;
  }
  for (int j = block.tid; j < width; j += block.threads) {
    output_tokens[b * width + j] = -1;
    accepted_nodes[b * width + j] = j == 0 ? 0 : -1;
  }
  block.sync();
  if (block.tid == 0) {
    state[0] = sampling::tree_walk(tokens + seq, parents + seq, accept_u + seq, probs,
                                   num_nodes, width, output_tokens + b * width,
                                   accepted_nodes + b * width, removed, &state[1], &state[2]);
  }
  block.sync();
  const int accepted = state[0], count = state[1], cur = state[2];
  const int64_t bonus = sampling::sample_row(block, logits + (seq + cur) * vocab, vocab, t,
                                             load_stats(m, kkey, tau, z, seq + cur), nullptr,
                                             removed, count, bonus_u[b]);
  if (block.tid == 0) {
    output_tokens[b * width + accepted] = bonus;
    num_accepted[b] = accepted;
  }
}

/// Stochastic chain acceptance of sequence b. Shared buffers: probs [N], draft [N], state [3].
template <typename T>
EK_HOST_DEVICE void accept_chain_at(
    const Block& block, const int64_t* tokens, const float* draft_probs, const T* logits,
    const float* accept_u, const float* bonus_u, const float* m, const int32_t* kkey,
    const float* tau, const float* z, const float* temperature, int64_t* output_tokens,
    int32_t* num_accepted, int32_t* accepted_nodes, int64_t b, int num_nodes, int64_t vocab,
    float* probs, float* draft, int* state) {
  const int64_t seq = b * num_nodes;
  const int64_t q_seq = b * (num_nodes - 1);
  const float t = temperature[b];
  for (int i = block.tid; i < num_nodes; i += block.threads) {
    const int64_t token = tokens[seq + i];
    const bool in_vocab = token >= 0 && token < vocab;  // else p = q = 0, nothing read
    probs[i] = i > 0 ? sampling::token_prob_checked(logits + (seq + i - 1) * vocab, vocab, token,
                                                    t, load_stats(m, kkey, tau, z, seq + i - 1))
                     : 0.0f;
    draft[i] = i > 0 && in_vocab ? draft_probs[(q_seq + i - 1) * vocab + token] : 0.0f;
    output_tokens[seq + i] = -1;
    accepted_nodes[seq + i] = i == 0 ? 0 : -1;
  }
  block.sync();
  if (block.tid == 0) {
    bool use_q = false;
    state[0] = sampling::chain_walk(tokens + seq, accept_u + seq, probs, draft, num_nodes,
                                    output_tokens + seq, accepted_nodes + seq, &state[1],
                                    &use_q);
    state[2] = use_q;
  }
  block.sync();
  const int accepted = state[0], row = state[1];
  const float* q = state[2] ? draft_probs + (q_seq + row) * vocab : nullptr;
  const int64_t bonus = sampling::sample_row(block, logits + (seq + row) * vocab, vocab, t,
                                             load_stats(m, kkey, tau, z, seq + row), q,
                                             nullptr, 0, bonus_u[b]);
  if (block.tid == 0) {
    output_tokens[seq + accepted] = bonus;
    num_accepted[b] = accepted;
  }
}

// --------------------------------------------------------------------------------------------
// Kernels
// --------------------------------------------------------------------------------------------

/// Most threads per block (sampling_threads); the kernels are built to launch with that many.
constexpr int kMaxThreads = 1024;

#define EK_BLOCK()                       \
  __shared__ int64_t scratch[33];        \
  const Block block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), scratch}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) row_stats_kernel(
    const T* logits, float* m, int32_t* kkey, float* tau, float* z, const float* temperature,
    const int32_t* top_k, const float* top_p, int64_t vocab, int64_t rows_per_param) {
  EK_BLOCK();
  row_stats_at(block, logits, m, kkey, tau, z, temperature, top_k, top_p, blockIdx.x, vocab,
               rows_per_param);
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) target_probs_kernel(
    const T* logits, float* out, const float* temperature, const int32_t* top_k,
    const float* top_p, int64_t vocab) {
  EK_BLOCK();
  target_probs_at(block, logits, out, temperature, top_k, top_p, blockIdx.x, vocab);
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) accept_tree_kernel(
    const int64_t* tokens, const int32_t* parents, const T* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int num_nodes, int64_t vocab, int width) {
  EK_BLOCK();
  extern __shared__ int64_t per_node[];  // removed [N] int64, then probs [N] float (shared_span)
  __shared__ int state[3];
  float* probs = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(per_node) +
                                          shared_span(num_nodes, sizeof(int64_t)));
  accept_tree_at(block, tokens, parents, logits, accept_u, bonus_u, m, kkey, tau, z,
                 temperature, output_tokens, num_accepted, accepted_nodes, blockIdx.x,
                 num_nodes, vocab, width, probs, per_node, state);
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) accept_chain_kernel(
    const int64_t* tokens, const float* draft_probs, const T* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int num_nodes, int64_t vocab) {
  EK_BLOCK();
  extern __shared__ float per_chain_node[];  // probs [N], then draft [N] (shared_span)
  __shared__ int state[3];
  float* draft = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(per_chain_node) +
                                          shared_span(num_nodes, sizeof(float)));
  accept_chain_at(block, tokens, draft_probs, logits, accept_u, bonus_u, m, kkey, tau, z,
                  temperature, output_tokens, num_accepted, accepted_nodes, blockIdx.x,
                  num_nodes, vocab, per_chain_node, draft, state);
}

#undef EK_BLOCK

/// Threads per row: more loads in flight for big vocabularies.
int sampling_threads(int64_t vocab) {
  if (vocab >= 32768) return kMaxThreads;
  if (vocab >= 4096) return 512;
  return static_cast<int>(std::min<int64_t>(256, ceil_div(vocab, 32) * 32));
}

/// Host "block": one thread, no scratch needed.
constexpr Block kHostBlock{0, 1, nullptr};

}  // namespace

cudaError_t launch_row_stats(const void* logits, float* m, int32_t* kkey, float* tau, float* z,
                             const float* temperature, const int32_t* top_k,
                             const float* top_p, int64_t rows, int64_t vocab,
                             int64_t rows_per_param, int dtype_code, cudaStream_t stream) {
  if (sampling::size_error(rows, vocab, dtype_code) != nullptr || rows_per_param < 1) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    row_stats_kernel<T><<<static_cast<unsigned>(rows), sampling_threads(vocab), 0, stream>>>(
        static_cast<const T*>(logits), m, kkey, tau, z, temperature, top_k, top_p, vocab,
        rows_per_param);
  });
  return cudaGetLastError();
}

cudaError_t launch_target_probs(const void* logits, float* out, const float* temperature,
                                const int32_t* top_k, const float* top_p, int64_t rows,
                                int64_t vocab, int dtype_code, cudaStream_t stream) {
  if (sampling::size_error(rows, vocab, dtype_code) != nullptr) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    target_probs_kernel<T><<<static_cast<unsigned>(rows), sampling_threads(vocab), 0, stream>>>(
        static_cast<const T*>(logits), out, temperature, top_k, top_p, vocab);
  });
  return cudaGetLastError();
}

cudaError_t launch_stochastic_accept_tree(
    const int64_t* tokens, const int32_t* parents, const void* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int64_t batch, int64_t num_nodes, int64_t vocab, int64_t width,
    int dtype_code, cudaStream_t stream) {
  if (sampling::accept_size_error(batch, num_nodes, vocab, width, dtype_code) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(shared_span(num_nodes, sizeof(int64_t)) +
                                            shared_span(num_nodes, sizeof(float)));
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    accept_tree_kernel<T><<<static_cast<unsigned>(batch), sampling_threads(vocab), shared,
                            stream>>>(
        tokens, parents, static_cast<const T*>(logits), accept_u, bonus_u, m, kkey, tau, z,
        temperature, output_tokens, num_accepted, accepted_nodes, static_cast<int>(num_nodes),
        vocab, static_cast<int>(width));
  });
  return cudaGetLastError();
}

cudaError_t launch_stochastic_accept_chain(
    const int64_t* tokens, const float* draft_probs, const void* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int64_t batch, int64_t num_nodes, int64_t vocab, int dtype_code,
    cudaStream_t stream) {
  if (sampling::accept_size_error(batch, num_nodes, vocab, num_nodes, dtype_code) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(2 * shared_span(num_nodes, sizeof(float)));
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    accept_chain_kernel<T><<<static_cast<unsigned>(batch), sampling_threads(vocab), shared,
                             stream>>>(
        tokens, draft_probs, static_cast<const T*>(logits), accept_u, bonus_u, m, kkey, tau, z,
        temperature, output_tokens, num_accepted, accepted_nodes, static_cast<int>(num_nodes),
        vocab);
  });
  return cudaGetLastError();
}

void row_stats_host(const void* logits, float* m, int32_t* kkey, float* tau, float* z,
                    const float* temperature, const int32_t* top_k, const float* top_p,
                    int64_t rows, int64_t vocab, int64_t rows_per_param, int dtype_code) {
  if (sampling::size_error(rows, vocab, dtype_code) != nullptr || rows_per_param < 1) return;
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t row = 0; row < rows; ++row) {
      row_stats_at(kHostBlock, static_cast<const T*>(logits), m, kkey, tau, z, temperature,
                   top_k, top_p, row, vocab, rows_per_param);
    }
  });
}

void target_probs_host(const void* logits, float* out, const float* temperature,
                       const int32_t* top_k, const float* top_p, int64_t rows, int64_t vocab,
                       int dtype_code) {
  if (sampling::size_error(rows, vocab, dtype_code) != nullptr) return;
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t row = 0; row < rows; ++row) {
      target_probs_at(kHostBlock, static_cast<const T*>(logits), out, temperature, top_k, top_p,
                      row, vocab);
    }
  });
}

void stochastic_accept_tree_host(
    const int64_t* tokens, const int32_t* parents, const void* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int64_t batch, int64_t num_nodes, int64_t vocab, int64_t width,
    int dtype_code) {
  if (sampling::accept_size_error(batch, num_nodes, vocab, width, dtype_code) != nullptr) return;
  float probs[sampling::kMaxNodes];
  int64_t removed[sampling::kMaxNodes];
  int state[3];
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t b = 0; b < batch; ++b) {
      accept_tree_at(kHostBlock, tokens, parents, static_cast<const T*>(logits), accept_u,
                     bonus_u, m, kkey, tau, z, temperature, output_tokens, num_accepted,
                     accepted_nodes, b, static_cast<int>(num_nodes), vocab,
                     static_cast<int>(width), probs, removed, state);
    }
  });
}

void stochastic_accept_chain_host(
    const int64_t* tokens, const float* draft_probs, const void* logits, const float* accept_u,
    const float* bonus_u, const float* m, const int32_t* kkey, const float* tau, const float* z,
    const float* temperature, int64_t* output_tokens, int32_t* num_accepted,
    int32_t* accepted_nodes, int64_t batch, int64_t num_nodes, int64_t vocab, int dtype_code) {
  if (sampling::accept_size_error(batch, num_nodes, vocab, num_nodes, dtype_code) != nullptr) {
    return;
  }
  float probs[sampling::kMaxNodes];
  float draft[sampling::kMaxNodes];
  int state[3];
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t b = 0; b < batch; ++b) {
      accept_chain_at(kHostBlock, tokens, draft_probs, static_cast<const T*>(logits), accept_u,
                      bonus_u, m, kkey, tau, z, temperature, output_tokens, num_accepted,
                      accepted_nodes, b, static_cast<int>(num_nodes), vocab, probs, draft,
                      state);
    }
  });
}

}  // namespace eagle_kernels
