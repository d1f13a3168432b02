/**
 * @file kv.cuh
 * @brief KV compaction: move each sequence's accepted path next to its prefix, every cache of
 *        every layer in one launch.
 *
 * Contract: eagle_kernels.ops.reference.compact_kv. Caches are raw rows of bytes: cache c is
 * [B, max_len, row_words[c]] words of `word_bytes` bytes (1, 2, 4, 8 or 16), so layers may differ
 * in head count, head size and dtype. For sequence b with L = cache_lens[b] and
 * n = min(num_accepted[b] + 1, width), row L + accepted_nodes[b, j] moves to row L + j for
 * j = 1 .. n - 1 (j = 0 is the root, already in place). A move whose source or target row lies
 * outside [0, max_len) (out-of-contract input, unchecked under graph capture) is skipped.
 *
 * Grid (cache, sequence, column chunk); each thread owns one word column and walks j upwards.
 * That order makes the in-place move safe without barriers: path nodes increase, so row L + j
 * is written only after every read of it (by a smaller j), and no later read hits a row written
 * before (node_j' > node_j >= j).
 */
#pragma once

#include <cstdint>

#include "common.cuh"

namespace eagle_kernels {
namespace kv {

/// 16 bytes as one word (one vector load / store on the GPU; a plain struct copy on the host).
struct alignas(16) Word16 {
  uint32_t parts[4];
};

/**
 * @brief Move word `column` of every accepted row of one sequence in one cache.
 *
 * @param seq        this sequence's rows: cache + b * max_len * row_words
 * @param nodes      accepted_nodes[b, :] (root first)
 * @param count      rows to place (root included), already clamped to the width
 */
template <typename Word>
EK_HOST_DEVICE void compact_column(Word* seq, int64_t row_words, int64_t column, int64_t prefix,
                                   int64_t max_len, const int32_t* nodes, int count) {
  for (int j = 1; j < count; ++j) {
    const int64_t node = nodes[j];
    if (node == j) continue;  // already in place
    // Source and target rows must lie in this sequence's [0, max_len): with the Python value
    // checks off (graph capture) a padding -1 or a bad length would otherwise hit another row.
    if (node < 0 || prefix < 0 || prefix + node >= max_len || prefix + j >= max_len) continue;
    seq[(prefix + j) * row_words + column] = seq[(prefix + node) * row_words + column];
  }
}

/// Rows to place for sequence b: num_accepted + 1, clamped to [0, width] (never out of bounds).
EK_HOST_DEVICE int place_count(int32_t num_accepted, int64_t width) {
  const int64_t count = static_cast<int64_t>(num_accepted) + 1;
  return static_cast<int>(count < 0 ? 0 : (count > width ? width : count));
}

/// Why these sizes cannot run, or nullptr when they can (bindings raise ValueError).
inline const char* size_error(int64_t num_caches, int64_t batch, int64_t max_len, int64_t width,
                              int64_t word_bytes, int64_t max_row_words) {
  if (num_caches < 0 || num_caches > 65535) return "compact_kv: num_caches must be in [0, 65535]";
  if (batch < 0 || batch > 65535) return "compact_kv: batch must be in [0, 65535]";
  if (max_len < 0 || width < 1 || width > INT32_MAX) {
    return "compact_kv: max_len must be >= 0 and width in [1, 2^31)";
  }
  if (word_bytes != 1 && word_bytes != 2 && word_bytes != 4 && word_bytes != 8 &&
      word_bytes != 16) {
    return "compact_kv: word_bytes must be 1, 2, 4, 8 or 16";
  }
  if (max_row_words < 0) return "compact_kv: max_row_words must be >= 0";
  return nullptr;
}

}  // namespace kv

/**
 * @brief Launch the compaction (device pointers, on `stream`).
 *
 * @param cache_addresses  [num_caches] int64 device array: address of each cache
 * @param row_words        [num_caches] int64 device array: words per (b, position) row
 * @param cache_lens       [batch] int32;  accepted_nodes [batch, width] int32;
 *                         num_accepted [batch] int32
 * @param max_row_words    the largest row_words entry (sizes the grid)
 */
cudaError_t launch_compact_kv(const int64_t* cache_addresses, const int64_t* row_words,
                              int64_t num_caches, const int32_t* cache_lens,
                              const int32_t* accepted_nodes, const int32_t* num_accepted,
                              int64_t batch, int64_t max_len, int64_t width, int64_t word_bytes,
                              int64_t max_row_words, cudaStream_t stream);

/// Host version (host pointers, host arrays, synchronous): the CPU check of the kernel's code.
void compact_kv_host(const int64_t* cache_addresses, const int64_t* row_words,
                     int64_t num_caches, const int32_t* cache_lens,
                     const int32_t* accepted_nodes, const int32_t* num_accepted, int64_t batch,
                     int64_t max_len, int64_t width, int64_t word_bytes);

}  // namespace eagle_kernels
