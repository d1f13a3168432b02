/**
 * @file kv.cu
 * @brief compact_kv kernel, launcher and host entry point (see kv.cuh).
 */
#include <cstdint>

#include "kv.cuh"

namespace eagle_kernels {
namespace {

constexpr int kThreads = 128;

/// Grid (cache, sequence, chunk of kThreads word columns).
template <typename Word>
__global__ void compact_kv_kernel(const int64_t* __restrict__ cache_addresses,
                                  const int64_t* __restrict__ row_words,
                                  const int32_t* __restrict__ cache_lens,
                                  const int32_t* __restrict__ accepted_nodes,
                                  const int32_t* __restrict__ num_accepted, int64_t max_len,
                                  int64_t width) {
  const int64_t words = row_words[blockIdx.x];
  const int64_t column = static_cast<int64_t>(blockIdx.z) * kThreads + threadIdx.x;
  if (column >= words) return;
  const int64_t b = blockIdx.y;
  Word* seq = reinterpret_cast<Word*>(cache_addresses[blockIdx.x]) + b * max_len * words;
  kv::compact_column(seq, words, column, cache_lens[b], max_len, accepted_nodes + b * width,
                     kv::place_count(num_accepted[b], width));
}

template <typename Word>
void launch_typed(const int64_t* addresses, const int64_t* row_words, int64_t num_caches,
                  const int32_t* cache_lens, const int32_t* nodes, const int32_t* num_accepted,
                  int64_t batch, int64_t max_len, int64_t width, int64_t max_row_words,
                  cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_caches), static_cast<unsigned>(batch),
                  static_cast<unsigned>(ceil_div(max_row_words, kThreads)));
  compact_kv_kernel<Word><<<grid, kThreads, 0, stream>>>(addresses, row_words, cache_lens, nodes,
                                                         num_accepted, max_len, width);
}

template <typename Word>
void host_typed(const int64_t* addresses, const int64_t* row_words, int64_t num_caches,
                const int32_t* cache_lens, const int32_t* nodes, const int32_t* num_accepted,
                int64_t batch, int64_t max_len, int64_t width) {
  for (int64_t c = 0; c < num_caches; ++c) {
    for (int64_t b = 0; b < batch; ++b) {
      Word* seq = reinterpret_cast<Word*>(addresses[c]) + b * max_len * row_words[c];
      for (int64_t column = 0; column < row_words[c]; ++column) {
        kv::compact_column(seq, row_words[c], column, cache_lens[b], max_len, nodes + b * width,
                           kv::place_count(num_accepted[b], width));
      }
    }
  }
}

}  // namespace

cudaError_t launch_compact_kv(const int64_t* cache_addresses, const int64_t* row_words,
                              int64_t num_caches, const int32_t* cache_lens,
                              const int32_t* accepted_nodes, const int32_t* num_accepted,
                              int64_t batch, int64_t max_len, int64_t width, int64_t word_bytes,
                              int64_t max_row_words, cudaStream_t stream) {
  if (kv::size_error(num_caches, batch, max_len, width, word_bytes, max_row_words) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (num_caches == 0 || batch == 0 || max_row_words == 0) return cudaSuccess;
  const auto args = [&](auto launch) {
    launch(cache_addresses, row_words, num_caches, cache_lens, accepted_nodes, num_accepted,
           batch, max_len, width, max_row_words, stream);
  };
  switch (word_bytes) {
    case 16: args(launch_typed<kv::Word16>); break;
    case 8: args(launch_typed<uint64_t>); break;
    case 4: args(launch_typed<uint32_t>); break;
    case 2: args(launch_typed<uint16_t>); break;
    default: args(launch_typed<uint8_t>); break;
  }
  return cudaGetLastError();
}

void compact_kv_host(const int64_t* cache_addresses, const int64_t* row_words,
                     int64_t num_caches, const int32_t* cache_lens,
                     const int32_t* accepted_nodes, const int32_t* num_accepted, int64_t batch,
                     int64_t max_len, int64_t width, int64_t word_bytes) {
  if (kv::size_error(num_caches, batch, max_len, width, word_bytes, 0) != nullptr) return;
  const auto args = [&](auto run) {
    run(cache_addresses, row_words, num_caches, cache_lens, accepted_nodes, num_accepted, batch,
        max_len, width);
  };
  switch (word_bytes) {
    case 16: args(host_typed<kv::Word16>); break;
    case 8: args(host_typed<uint64_t>); break;
    case 4: args(host_typed<uint32_t>); break;
    case 2: args(host_typed<uint16_t>); break;
    default: args(host_typed<uint8_t>); break;
  }
}

}  // namespace eagle_kernels
