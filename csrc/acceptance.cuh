/**
 * @file acceptance.cuh
 * @brief Greedy tree acceptance: row argmax of the target logits, then the best draft path.
 *
 * Contract: eagle_kernels.ops.reference.greedy_accept_tree, split in two kernels:
 *
 *   argmax_rows:          logits [R, V] float32 / float16 / bfloat16 -> target_ids [R] int64
 *                         (R = B * N; ties: lowest index; NaN counts as the largest value,
 *                         first NaN wins, exactly like torch.argmax)
 *   greedy_accept_paths:  tokens [B, N] int64, paths [B, P, W] int32 (-1 padded),
 *                         target_ids [B, N] int64 ->
 *                           output_tokens  [B, W] int64  accepted draft tokens, then the bonus
 *                                                        token (target_ids at the last accepted
 *                                                        node), then -1
 *                           num_accepted   [B]    int32  draft tokens accepted (bonus excluded)
 *                           accepted_nodes [B, W] int32  root, then the accepted nodes, then -1
 *
 * Path row r accepts its first k draft nodes where k is the longest prefix with
 * tokens[path[j + 1]] == target_ids[path[j]] and path[j + 1] a node; a padding row
 * (path[0] < 0) scores -1. The best row has the largest score, ties: lowest row.
 *
 * Outside the contract (every row padding, or P == 0, where the reference raises) the result is
 * "root only": num_accepted 0, accepted_nodes [0, -1, ...], output_tokens [target_ids[0], -1, ...].
 * Node indices outside [0, N) in `paths` end a path; nothing is ever read out of bounds.
 */
#pragma once

#include <cstdint>

#include "common.cuh"

namespace eagle_kernels {
namespace acceptance {


/// Whether `node` indexes one of the N tree nodes.
EK_HOST_DEVICE bool is_node(int node, int num_nodes) { return node >= 0 && node < num_nodes; }

/**
 * @brief Number of draft nodes that path row `path` (width entries) accepts; -1 for padding.
 *
 * @param tokens      [N] int64 tree tokens of this sequence
 * @param target_ids  [N] int64 target argmax at each node of this sequence
 */
EK_HOST_DEVICE int path_accept_length(const int64_t* tokens, const int64_t* target_ids,
                                      const int32_t* path, int width, int num_nodes) {
  int cur = path[0];
  if (!is_node(cur, num_nodes)) return -1;
  int length = 0;
  for (int j = 1; j < width; ++j) {
    const int next = path[j];
    if (!is_node(next, num_nodes) || tokens[next] != target_ids[cur]) break;
    ++length;
    cur = next;
  }
  return length;
}

/**
 * @brief Write position j of one sequence's outputs, given the winning path row.
 *
 * @param best_path     the winning row, or nullptr for the "root only" fallback (no valid row)
 * @param num_accepted  its accepted length (0 for the fallback); < width by construction
 */
EK_HOST_DEVICE void write_accept_position(const int64_t* tokens, const int64_t* target_ids,
                                          const int32_t* best_path, int num_accepted, int j,
                                          int64_t* output_tokens, int32_t* accepted_nodes) {
  const int32_t root_only[1] = {0};
  const int32_t* path = best_path != nullptr ? best_path : root_only;
  accepted_nodes[j] = j <= num_accepted ? path[j] : -1;
  if (j < num_accepted) {
    output_tokens[j] = tokens[path[j + 1]];
  } else if (j == num_accepted) {
    output_tokens[j] = target_ids[path[j]];  // the bonus token
  } else {
    output_tokens[j] = -1;
  }
}

/// Why these argmax sizes cannot run, or nullptr when they can (bindings raise ValueError).
inline const char* argmax_size_error(int64_t rows, int64_t vocab, int dtype_code) {
  if (rows < 0 || rows > INT32_MAX) return "argmax_rows: rows must be in [0, 2^31)";
  if (vocab < 1) return "argmax_rows: vocab must be >= 1";
  if (dtype_code < kFloat32 || dtype_code > kBFloat16) {
    return "argmax_rows: dtype_code must be 0 (float32), 1 (float16) or 2 (bfloat16)";
  }
  return nullptr;
}

/// Why these acceptance sizes cannot run, or nullptr when they can.
inline const char* accept_size_error(int64_t batch, int64_t num_nodes, int64_t num_paths,
                                     int64_t width) {
  if (batch < 0 || batch > INT32_MAX) return "greedy_accept_paths: batch must be in [0, 2^31)";
  if (num_nodes < 1 || num_nodes > INT32_MAX) {
    return "greedy_accept_paths: num_nodes must be in [1, 2^31)";
  }
  if (num_paths < 0 || num_paths > INT32_MAX) {
    return "greedy_accept_paths: num_paths must be in [0, 2^31)";
  }
  if (width < 1 || width > INT32_MAX) return "greedy_accept_paths: width must be in [1, 2^31)";
  return nullptr;
}

}  // namespace acceptance

/**
 * @brief Launch the row argmax: out[r] = argmax(logits[r, :]) (device pointers, on `stream`).
 *
 * @param logits      [rows, vocab], dtype given by dtype_code (0 float32, 1 float16, 2 bfloat16)
 * @param out         [rows] int64 (output)
 * @return the launch status; cudaErrorInvalidValue for rejected sizes or dtype codes.
 */
cudaError_t launch_argmax_rows(const void* logits, int64_t* out, int64_t rows, int64_t vocab,
                               int dtype_code, cudaStream_t stream);

/**
 * @brief Launch greedy acceptance of `batch` trees (device pointers, on `stream`); one block
 *        per sequence. Shapes in the file comment (P = num_paths, W = width).
 */
cudaError_t launch_greedy_accept_paths(const int64_t* tokens, const int32_t* paths,
                                       const int64_t* target_ids, int64_t* output_tokens,
                                       int32_t* num_accepted, int32_t* accepted_nodes,
                                       int64_t batch, int64_t num_nodes, int64_t num_paths,
                                       int64_t width, cudaStream_t stream);

/// Host versions of the two launchers (host pointers, synchronous): the CPU check of the kernels.
void argmax_rows_host(const void* logits, int64_t* out, int64_t rows, int64_t vocab,
                      int dtype_code);
void greedy_accept_paths_host(const int64_t* tokens, const int32_t* paths,
                              const int64_t* target_ids, int64_t* output_tokens,
                              int32_t* num_accepted, int32_t* accepted_nodes, int64_t batch,
                              int64_t num_nodes, int64_t num_paths, int64_t width);

}  // namespace eagle_kernels
