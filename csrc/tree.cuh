/**
 * @file tree.cuh
 * @brief Tree construction: parents -> depth, packed ancestor mask, root-to-leaf paths.
 *
 * Contract: eagle_kernels.ops.reference.build_tree. For B trees of N nodes each:
 *
 *   parents   [B, N]                 int32  parents[b, 0] == -1, 0 <= parents[b, i] < i
 *   depth     [B, N]                 int32  root 0
 *   tree_mask [B, N, ceil(N / 32)]   int32  row i: bit (j % 32) of word (j / 32) is set iff node j
 *                                           is i or an ancestor of i; bits past N are zero
 *   paths     [B, N, max_depth + 1]  int32  row r: root -> r-th leaf (leaves in ascending node
 *                                           index), padded with -1; rows past the leaf count -1
 *
 * The per-node functions below are EK_HOST_DEVICE: the kernel (one block per tree, threads
 * striding over nodes) and the host entry point run the same code.
 *
 * eagle2_rerank (contract: eagle_kernels.ops.reference.eagle2_rerank) keeps the best N - 1 of M
 * candidates per tree and builds the tree from them in the same launch:
 *
 *   root_tokens [B] int64, cand_tokens [B, M] int64, cand_scores [B, M] float32,
 *   cand_parents [B, M] int32 (-1: child of the root)  ->  tokens [B, N] int64, parents, depth
 *   [B, N] int32, scores [B, N] float32, tree_mask, paths as above, selected [B, N - 1] int64
 *
 * A kept candidate whose parent was not kept (the reference raises ValueError) gets parent -1,
 * which the Python op turns into that ValueError; the rest of the tree is still built in bounds.
 *
 * Invalid input (parents not topologically ordered, a tree deeper than max_depth) gives
 * unspecified values but never an out-of-bounds access: an ancestor walk only ever steps to a
 * strictly smaller index (a parent outside [0, node) ends the walk as if node were a root), and
 * every write is bounded by the row it belongs to. The Python op validates inputs first.
 */
#pragma once

#include <cstdint>

#include "common.cuh"
#include "topk.cuh"

namespace eagle_kernels {
namespace tree {

/// Largest N the kernel takes: one int32 of shared memory per node must fit in 48 KiB.
constexpr int64_t kMaxNodes = 8192;

/// Parent of `node` if stepping to it is valid (0 <= parent < node), else -1 (treat as root).
EK_HOST_DEVICE int checked_parent(const int32_t* parents, int node) {
  if (node <= 0) return -1;
  const int parent = parents[node];
  return (parent >= 0 && parent < node) ? parent : -1;
}

/// Number of ancestor steps from `node` to the root.
EK_HOST_DEVICE int node_depth(const int32_t* parents, int node) {
  int depth = 0;
  for (int cur = checked_parent(parents, node); cur >= 0; cur = checked_parent(parents, cur)) {
    ++depth;
  }
  return depth;
}

/**
 * @brief Write row `node` of the packed ancestor mask: `words` int32 words.
 *
 * Ancestors have strictly decreasing indices, so one walk fills the words from the last to the
 * first, writing each word exactly once (no zeroing pass, no read-modify-write).
 */
EK_HOST_DEVICE void write_mask_row(const int32_t* parents, int node, int words, int32_t* row) {
  int cur = node;
  for (int word = words - 1; word >= 0; --word) {
    uint32_t bits = 0;
    while (cur >= 0 && cur / kMaskWordBits == word) {
      bits |= 1u << (cur % kMaskWordBits);
      cur = checked_parent(parents, cur);
    }
    row[word] = static_cast<int32_t>(bits);
  }
}

/**
 * @brief Write the path row of `leaf` (root first) into `row` of `width` entries, -1 padded.
 *
 * `depth` is node_depth(parents, leaf). Positions >= width are dropped (only reachable when the
 * tree is deeper than max_depth, which the Python op rejects).
 */
EK_HOST_DEVICE void write_path_row(const int32_t* parents, int leaf, int depth, int width,
                                   int32_t* row) {
  for (int j = depth + 1; j < width; ++j) row[j] = -1;
  int cur = leaf;
  for (int j = depth; j >= 0 && cur >= 0; --j) {
    if (j < width) row[j] = cur;
    cur = checked_parent(parents, cur);
  }
}

/// Fill `count` int32 entries with -1 (padding path rows).
EK_HOST_DEVICE void fill_padding(int32_t* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = -1;
}

/**
 * @brief Why (batch, num_nodes, max_depth) cannot be built, or nullptr when they can.
 *
 * Checked by the bindings (which raise ValueError) and again by the launchers.
 */
inline const char* size_error(int64_t batch, int64_t num_nodes, int64_t max_depth) {
  if (batch < 0 || batch > INT32_MAX) return "build_tree: batch must be in [0, 2^31)";
  if (num_nodes < 1 || num_nodes > kMaxNodes) return "build_tree: num_nodes must be in [1, 8192]";
  if (max_depth < 0 || max_depth >= INT32_MAX) return "build_tree: max_depth must be >= 0";
  return nullptr;
}

// ------------------------------------------------------------------------------------------
// eagle2_rerank: per-candidate steps shared by the kernel and the host twin
// ------------------------------------------------------------------------------------------

constexpr int64_t kMaxCandidates = 2048;  ///< M: 12 bytes of shared memory per candidate

/// One tree's candidates (pointers already offset to the tree).
struct CandidateSet {
  const int64_t* tokens;
  const float* scores;
  const int32_t* parents;
  int64_t count;
};

/// One tree's rerank outputs besides depth / mask / paths.
struct TreeOut {
  int64_t* tokens;
  int32_t* parents;
  float* scores;
  int64_t* selected;
};

/// Ordering key of candidate i (topk.cuh: larger score first, ties by lower index).
EK_HOST_DEVICE int64_t candidate_key(const CandidateSet& set, int i) {
  return topk::order_key(set.scores[i], i);
}

/// 1 if candidate i is among the `keep` best (keys are unique: exactly `keep` are), else 0.
EK_HOST_DEVICE int32_t is_selected(const int64_t* keys, int candidates, int i, int keep) {
  return topk::key_rank(keys, candidates, keys[i]) < keep ? 1 : 0;
}

/// Whether candidate i was kept, from the inclusive scan of the selection flags.
EK_HOST_DEVICE bool kept(const int32_t* scan, int i) {
  return scan[i] != (i > 0 ? scan[i - 1] : 0);
}

/**
 * @brief Write kept candidate i as node scan[i]: token, score, selected, parent node.
 *
 * Parent node: 0 for a child of the root (candidate parent < 0), the parent's node number if
 * it was kept, else -1 (also for a parent index >= i, which validation rejects).
 */
EK_HOST_DEVICE void write_kept_candidate(const CandidateSet& set, const int32_t* scan, int i,
                                         const TreeOut& out) {
  if (!kept(scan, i)) return;
  const int node = scan[i];
  const int parent = set.parents[i];
  int parent_node = -1;
  if (parent < 0) {
    parent_node = 0;
  } else if (parent < i && kept(scan, parent)) {
    parent_node = scan[parent];
  }
  out.tokens[node] = set.tokens[i];
  out.scores[node] = set.scores[i];
  out.parents[node] = parent_node;
  out.selected[node - 1] = i;
}

/// Node 0: the root token, no parent, score 0.
EK_HOST_DEVICE void write_root(int64_t root_token, const TreeOut& out) {
  out.tokens[0] = root_token;
  out.parents[0] = -1;
  out.scores[0] = 0.0f;
}

inline const char* rerank_size_error(int64_t batch, int64_t candidates, int64_t num_nodes,
                                     int64_t max_depth) {
  if (batch < 0 || batch > INT32_MAX) return "eagle2_rerank: batch must be in [0, 2^31)";
  if (candidates < 1 || candidates > kMaxCandidates) {
    return "eagle2_rerank: M (candidates) must be in [1, 2048] for the cuda backend";
  }
  if (num_nodes < 1 || num_nodes > candidates + 1) return "eagle2_rerank: N must be in [1, M+1]";
  if (max_depth < 0 || max_depth >= INT32_MAX) return "eagle2_rerank: max_depth must be >= 0";
  return nullptr;
}

}  // namespace tree

/**
 * @brief Launch eagle2_rerank for `batch` trees on `stream` (device pointers; shapes in the
 *        file comment). cudaErrorInvalidValue for sizes rejected by tree::rerank_size_error.
 */
cudaError_t launch_eagle2_rerank(const int64_t* root_tokens, const int64_t* cand_tokens,
                                 const float* cand_scores, const int32_t* cand_parents,
                                 int64_t* tokens, int32_t* parents, int32_t* depth, float* scores,
                                 int32_t* tree_mask, int32_t* paths, int64_t* selected,
                                 int64_t batch, int64_t candidates, int64_t num_nodes,
                                 int64_t max_depth, cudaStream_t stream);

/// Same as launch_eagle2_rerank, on host pointers, synchronously.
void eagle2_rerank_host(const int64_t* root_tokens, const int64_t* cand_tokens,
                        const float* cand_scores, const int32_t* cand_parents, int64_t* tokens,
                        int32_t* parents, int32_t* depth, float* scores, int32_t* tree_mask,
                        int32_t* paths, int64_t* selected, int64_t batch, int64_t candidates,
                        int64_t num_nodes, int64_t max_depth);

/**
 * @brief Launch tree construction for `batch` trees on `stream` (device pointers).
 *
 * @param parents    [batch, num_nodes] int32
 * @param depth      [batch, num_nodes] int32 (output)
 * @param tree_mask  [batch, num_nodes, ceil(num_nodes / 32)] int32 (output)
 * @param paths      [batch, num_nodes, max_depth + 1] int32 (output)
 * @return the launch status (cudaGetLastError() after the launch); cudaErrorInvalidValue for
 *         sizes rejected by tree::size_error. Nothing is launched when batch == 0.
 */
cudaError_t launch_build_tree(const int32_t* parents, int32_t* depth, int32_t* tree_mask,
                              int32_t* paths, int64_t batch, int64_t num_nodes,
                              int64_t max_depth, cudaStream_t stream);

/// Same as launch_build_tree, on host pointers, synchronously (the CPU check of the kernel).
void build_tree_host(const int32_t* parents, int32_t* depth, int32_t* tree_mask, int32_t* paths,
                     int64_t batch, int64_t num_nodes, int64_t max_depth);

}  // namespace eagle_kernels
