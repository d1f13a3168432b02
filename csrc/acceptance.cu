/**
 * @file acceptance.cu
 * @brief argmax_rows and greedy_accept_paths kernels, launchers and host entry points
 *        (see acceptance.cuh for shapes and the exact rule).
 */
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "acceptance.cuh"

namespace eagle_kernels {
namespace {

// --------------------------------------------------------------------------------------------
// Row argmax
// --------------------------------------------------------------------------------------------

/// A candidate that loses to every element (even a -inf one, by index).
EK_HOST_DEVICE Candidate<float> no_candidate() { return {-INFINITY, INT64_MAX}; }

/// Fold element `index` with `value` into the running best.
EK_HOST_DEVICE void consider(Candidate<float>& best, float value, int64_t index) {
  const Candidate<float> candidate{value, index};
  if (LargerFloatFirst()(candidate, best)) best = candidate;
}

/// 16 bytes of logits: one vectorised load.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T values[kSize];
};

/**
 * @brief One block per row. Threads stride over the row with 16-byte loads (kUnroll of them
 *        in flight per thread), the unaligned head and the tail element by element; then a
 *        block reduction. Rows of a [R, V] tensor need not be 16-byte aligned (V odd), hence
 *        the per-row head.
 */
template <typename T>
__global__ void argmax_rows_kernel(const T* __restrict__ logits, int64_t* __restrict__ out,
                                   int64_t vocab) {
  constexpr int kVec = Pack<T>::kSize;
  constexpr int kUnroll = 4;
  __shared__ Candidate<float> scratch[32];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const auto misalignment = reinterpret_cast<uintptr_t>(row) % 16;
  const int64_t unaligned = misalignment ? (16 - misalignment) / sizeof(T) : 0;
  const int64_t head = unaligned < vocab ? unaligned : vocab;
  const int64_t num_packs = (vocab - head) / kVec;
  const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(row + head);

  Candidate<float> best = no_candidate();
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) consider(best, to_float(row[i]), i);
  for (int64_t first = threadIdx.x; first < num_packs; first += int64_t(blockDim.x) * kUnroll) {
    Pack<T> loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = first + int64_t(u) * blockDim.x;
      if (p < num_packs) loaded[u] = packs[p];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = first + int64_t(u) * blockDim.x;
      if (p >= num_packs) break;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        consider(best, to_float(loaded[u].values[k]), head + p * kVec + k);
      }
    }
  }
  for (int64_t i = head + num_packs * kVec + threadIdx.x; i < vocab; i += blockDim.x) {
    consider(best, to_float(row[i]), i);
  }
  best = block_best(best, LargerFloatFirst(), scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = best.index;
}

/// Threads per row: more loads in flight for big vocabularies (few rows must still fill HBM).
int argmax_threads(int64_t vocab) {
  if (vocab >= 32768) return 1024;
  if (vocab >= 4096) return 512;
  return static_cast<int>(std::min<int64_t>(256, ceil_div(vocab, 32) * 32));
}

template <typename T>
void launch_argmax_typed(const void* logits, int64_t* out, int64_t rows, int64_t vocab,
                         cudaStream_t stream) {
  argmax_rows_kernel<T><<<static_cast<unsigned>(rows), argmax_threads(vocab), 0, stream>>>(
      static_cast<const T*>(logits), out, vocab);
}

template <typename T>
void argmax_rows_host_typed(const void* logits, int64_t* out, int64_t rows, int64_t vocab) {
  const T* data = static_cast<const T*>(logits);
  for (int64_t r = 0; r < rows; ++r) {
    Candidate<float> best = no_candidate();
    for (int64_t i = 0; i < vocab; ++i) consider(best, to_float(data[r * vocab + i]), i);
    out[r] = best.index;
  }
}

// --------------------------------------------------------------------------------------------
// Greedy acceptance
// --------------------------------------------------------------------------------------------

/// A row that loses to every path row, padding rows (score -1) included.
EK_HOST_DEVICE Candidate<int> no_row() { return {-2, INT64_MAX}; }

/// One block per sequence: threads score path rows, reduce to the best, write the outputs.
__global__ void greedy_accept_paths_kernel(
    const int64_t* __restrict__ tokens, const int32_t* __restrict__ paths,
    const int64_t* __restrict__ target_ids, int64_t* __restrict__ output_tokens,
    int32_t* __restrict__ num_accepted, int32_t* __restrict__ accepted_nodes, int num_nodes,
    int num_paths, int width) {
  __shared__ Candidate<int> scratch[32];
  const int64_t b = blockIdx.x;
  const int64_t* seq_tokens = tokens + b * num_nodes;
  const int64_t* seq_targets = target_ids + b * num_nodes;
  const int32_t* seq_paths = paths + b * num_paths * width;

  Candidate<int> best = no_row();
  for (int row = threadIdx.x; row < num_paths; row += blockDim.x) {
    const Candidate<int> candidate{acceptance::path_accept_length(
        seq_tokens, seq_targets, seq_paths + int64_t(row) * width, width, num_nodes), row};
    if (LargerIntFirst()(candidate, best)) best = candidate;
  }
  best = block_best(best, LargerIntFirst(), scratch);

  const bool found = best.key >= 0;
  const int32_t* best_path = found ? seq_paths + best.index * width : nullptr;
  const int accepted = found ? best.key : 0;
  for (int j = threadIdx.x; j < width; j += blockDim.x) {
    acceptance::write_accept_position(seq_tokens, seq_targets, best_path, accepted, j,
                                      output_tokens + b * width, accepted_nodes + b * width);
  }
  if (threadIdx.x == 0) num_accepted[b] = accepted;
}

/// Threads per sequence: one path row each, in whole warps, at most 256.
int accept_threads(int64_t num_paths) {
  const int64_t warps = std::max<int64_t>(1, ceil_div(num_paths, 32));
  return static_cast<int>(std::min<int64_t>(256, warps * 32));
}

}  // namespace

cudaError_t launch_argmax_rows(const void* logits, int64_t* out, int64_t rows, int64_t vocab,
                               int dtype_code, cudaStream_t stream) {
  if (acceptance::argmax_size_error(rows, vocab, dtype_code) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  dispatch_dtype(dtype_code, [&](auto tag) {
    launch_argmax_typed<decltype(tag)>(logits, out, rows, vocab, stream);
  });
  return cudaGetLastError();
}

cudaError_t launch_greedy_accept_paths(const int64_t* tokens, const int32_t* paths,
                                       const int64_t* target_ids, int64_t* output_tokens,
                                       int32_t* num_accepted, int32_t* accepted_nodes,
                                       int64_t batch, int64_t num_nodes, int64_t num_paths,
                                       int64_t width, cudaStream_t stream) {
  if (acceptance::accept_size_error(batch, num_nodes, num_paths, width) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0) return cudaSuccess;
  greedy_accept_paths_kernel<<<static_cast<unsigned>(batch), accept_threads(num_paths), 0,
                               stream>>>(tokens, paths, target_ids, output_tokens, num_accepted,
                                         accepted_nodes, static_cast<int>(num_nodes),
                                         static_cast<int>(num_paths), static_cast<int>(width));
  return cudaGetLastError();
}

void argmax_rows_host(const void* logits, int64_t* out, int64_t rows, int64_t vocab,
                      int dtype_code) {
  if (acceptance::argmax_size_error(rows, vocab, dtype_code) != nullptr) return;
  dispatch_dtype(dtype_code, [&](auto tag) {
    argmax_rows_host_typed<decltype(tag)>(logits, out, rows, vocab);
  });
}

void greedy_accept_paths_host(const int64_t* tokens, const int32_t* paths,
                              const int64_t* target_ids, int64_t* output_tokens,
                              int32_t* num_accepted, int32_t* accepted_nodes, int64_t batch,
                              int64_t num_nodes, int64_t num_paths, int64_t width) {
  if (acceptance::accept_size_error(batch, num_nodes, num_paths, width) != nullptr) return;
  const int nodes = static_cast<int>(num_nodes);
  const int rows = static_cast<int>(num_paths);
  const int cols = static_cast<int>(width);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* seq_tokens = tokens + b * nodes;
    const int64_t* seq_targets = target_ids + b * nodes;
    const int32_t* seq_paths = paths + b * rows * cols;
    Candidate<int> best = no_row();
    for (int row = 0; row < rows; ++row) {
      const Candidate<int> candidate{acceptance::path_accept_length(
          seq_tokens, seq_targets, seq_paths + int64_t(row) * cols, cols, nodes), row};
      if (LargerIntFirst()(candidate, best)) best = candidate;
    }
    const bool found = best.key >= 0;
    const int accepted = found ? best.key : 0;
    for (int j = 0; j < cols; ++j) {
      acceptance::write_accept_position(seq_tokens, seq_targets,
                                        found ? seq_paths + best.index * cols : nullptr, accepted,
                                        j, output_tokens + b * cols, accepted_nodes + b * cols);
    }
    num_accepted[b] = accepted;
  }
}

}  // namespace eagle_kernels
