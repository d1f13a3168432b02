/**
 * @file tree.cu
 * @brief build_tree kernel, its launcher and the host entry point (see tree.cuh).
 *
 * build_tree: one block per tree. Threads stride over nodes three times:
 *   1. leaf flags in shared memory (every node starts as a leaf; a child clears its parent),
 *      plus each node's depth and mask row, which need nothing but `parents`;
 *   2. an in-place inclusive scan of the flags gives each leaf its path row;
 *   3. each leaf writes its path row, and the rows past the leaf count are filled with -1.
 * eagle2_rerank: one block per tree selects the kept candidates (rank count over unique keys,
 * see topk.cuh), numbers them with the same scan, writes them, then runs build_tree's block.
 */
#include <algorithm>
#include <vector>

#include "tree.cuh"

namespace eagle_kernels {
namespace {

/**
 * @brief In-place inclusive prefix sum of data[0, n) in shared memory; returns the total.
 *
 * Scans blockDim.x elements at a time (warp shuffles, then the warp totals) and carries the
 * running total from chunk to chunk. blockDim.x must be a multiple of 32; call from every
 * thread of the block.
 */
__device__ int block_inclusive_scan(int32_t* data, int n, int32_t* warp_totals) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  int carry = 0;
  for (int base = 0; base < n; base += blockDim.x) {
    const int i = base + threadIdx.x;
    int value = i < n ? data[i] : 0;
    for (int delta = 1; delta < 32; delta <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, value, delta);
      if (lane >= delta) value += up;
    }
    if (lane == 31) warp_totals[warp] = value;
    __syncthreads();
    if (warp == 0) {
      int total = lane < num_warps ? warp_totals[lane] : 0;
      for (int delta = 1; delta < 32; delta <<= 1) {
        const int up = __shfl_up_sync(0xffffffffu, total, delta);
        if (lane >= delta) total += up;
      }
      warp_totals[lane] = total;
    }
    __syncthreads();
    if (warp > 0) value += warp_totals[warp - 1];
    if (i < n) data[i] = carry + value;
    carry += warp_totals[num_warps - 1];
    __syncthreads();  // warp_totals is rewritten by the next chunk
  }
  return carry;
}

/**
 * @brief Build one tree with the whole block; `parents` may have been written by this block
 *        (call after a __syncthreads()). `leaf_rank` is [num_nodes] int32 shared memory.
 */
__device__ void build_tree_block(const int32_t* tree_parents, int32_t* tree_depth,
                                 int32_t* tree_masks, int32_t* tree_paths, int num_nodes,
                                 int words, int width, int32_t* leaf_rank,
                                 int32_t* warp_totals) {
  for (int node = threadIdx.x; node < num_nodes; node += blockDim.x) leaf_rank[node] = 1;
  __syncthreads();
  for (int node = threadIdx.x; node < num_nodes; node += blockDim.x) {
    const int parent = tree::checked_parent(tree_parents, node);
    if (parent >= 0) leaf_rank[parent] = 0;  // benign race: every writer stores 0
    tree_depth[node] = tree::node_depth(tree_parents, node);
    tree::write_mask_row(tree_parents, node, words, tree_masks + int64_t(node) * words);
  }
  __syncthreads();
  const int num_leaves = block_inclusive_scan(leaf_rank, num_nodes, warp_totals);

  for (int node = threadIdx.x; node < num_nodes; node += blockDim.x) {
    const int before = node > 0 ? leaf_rank[node - 1] : 0;
    if (leaf_rank[node] == before) continue;  // not a leaf
    int32_t* row = tree_paths + int64_t(before) * width;
    // tree_depth[node] was written by this thread (same striding) in the first loop.
    tree::write_path_row(tree_parents, node, tree_depth[node], width, row);
  }
  const int64_t padding = int64_t(num_nodes - num_leaves) * width;
  int32_t* padding_rows = tree_paths + int64_t(num_leaves) * width;
  for (int64_t i = threadIdx.x; i < padding; i += blockDim.x) padding_rows[i] = -1;
}

__global__ void build_tree_kernel(const int32_t* __restrict__ parents, int32_t* __restrict__ depth,
                                  int32_t* __restrict__ tree_mask, int32_t* __restrict__ paths,
                                  int num_nodes, int words, int width) {
  extern __shared__ int32_t leaf_rank[];  // [num_nodes] leaf flags, then ranks (shared_span)
  __shared__ int32_t warp_totals[32];
  const int64_t tree_index = blockIdx.x;
  build_tree_block(parents + tree_index * num_nodes, depth + tree_index * num_nodes,
                   tree_mask + tree_index * num_nodes * words,
                   paths + tree_index * num_nodes * width, num_nodes, words, width, leaf_rank,
                   warp_totals);
}

/**
 * @brief eagle2_rerank: one block per tree, the whole tree in one launch.
 *
 * 1. keys of all M candidates into shared memory; 2. kept[i] = rank(i) < N - 1 (every thread
 * counts better keys for its candidates); 3. an inclusive scan of kept gives each kept
 * candidate its node number (candidate order = topological order); 4. kept candidates write
 * token, score, selected and parent node; 5. build_tree_block on the parents just written.
 * Dynamic shared memory: M int64 keys, M int32 scan, N int32 leaf ranks.
 */
__global__ void rerank_kernel(const int64_t* __restrict__ root_tokens,
                              const int64_t* __restrict__ cand_tokens,
                              const float* __restrict__ cand_scores,
                              const int32_t* __restrict__ cand_parents, int64_t* tokens,
                              int32_t* parents, int32_t* depth, float* scores, int32_t* tree_mask,
                              int32_t* paths, int64_t* selected, int candidates, int num_nodes,
                              int words, int width) {
  // [M] keys, then [M] kept / node numbers, then [N] ranks, each padded to 16 bytes
  extern __shared__ __align__(16) unsigned char rerank_shared[];
  int64_t* keys = reinterpret_cast<int64_t*>(rerank_shared);
  int32_t* node_of = reinterpret_cast<int32_t*>(rerank_shared +
                                                shared_span(candidates, sizeof(int64_t)));
  int32_t* leaf_rank = reinterpret_cast<int32_t*>(reinterpret_cast<unsigned char*>(node_of) +
                                                  shared_span(candidates, sizeof(int32_t)));
  __shared__ int32_t warp_totals[32];
  const int64_t b = blockIdx.x;
  const tree::CandidateSet set{cand_tokens + b * candidates, cand_scores + b * candidates,
                               cand_parents + b * candidates, candidates};
  const tree::TreeOut out{tokens + b * num_nodes, parents + b * num_nodes,
                          scores + b * num_nodes, selected + b * (num_nodes - 1)};
  for (int i = threadIdx.x; i < candidates; i += blockDim.x) {
    keys[i] = tree::candidate_key(set, i);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < candidates; i += blockDim.x) {
    node_of[i] = tree::is_selected(keys, candidates, i, num_nodes - 1);
  }
  __syncthreads();
  block_inclusive_scan(node_of, candidates, warp_totals);
  for (int i = threadIdx.x; i < candidates; i += blockDim.x) {
    tree::write_kept_candidate(set, node_of, i, out);
  }
  if (threadIdx.x == 0) tree::write_root(root_tokens[b], out);
  __syncthreads();  // the parents written above are read by every thread below
  build_tree_block(out.parents, depth + b * num_nodes, tree_mask + b * num_nodes * words,
                   paths + b * num_nodes * width, num_nodes, words, width, leaf_rank,
                   warp_totals);
}

/// Threads per tree: enough warps to cover the nodes once, at most 256.
int tree_threads(int64_t num_nodes) {
  return static_cast<int>(std::min<int64_t>(256, ceil_div(num_nodes, 32) * 32));
}

/// One tree on the host: the kernel's three passes, run serially.
void build_one_tree_host(const int32_t* parents, int32_t* depth, int32_t* tree_mask,
                         int32_t* paths, int num_nodes, int words, int width) {
  std::vector<int32_t> is_leaf(num_nodes, 1);
  for (int node = 0; node < num_nodes; ++node) {
    const int parent = tree::checked_parent(parents, node);
    if (parent >= 0) is_leaf[parent] = 0;
    depth[node] = tree::node_depth(parents, node);
    tree::write_mask_row(parents, node, words, tree_mask + int64_t(node) * words);
  }
  int num_leaves = 0;
  for (int node = 0; node < num_nodes; ++node) {
    if (!is_leaf[node]) continue;
    tree::write_path_row(parents, node, depth[node], width, paths + int64_t(num_leaves) * width);
    ++num_leaves;
  }
  tree::fill_padding(paths + int64_t(num_leaves) * width, int64_t(num_nodes - num_leaves) * width);
}

/// One rerank on the host: the kernel's steps, run serially.
void rerank_one_host(int64_t root_token, const tree::CandidateSet& set, const tree::TreeOut& out,
                     int32_t* depth, int32_t* tree_mask, int32_t* paths, int num_nodes, int words,
                     int width) {
  const int candidates = static_cast<int>(set.count);
  std::vector<int64_t> keys(candidates);
  std::vector<int32_t> node_of(candidates);
  for (int i = 0; i < candidates; ++i) keys[i] = tree::candidate_key(set, i);
  for (int i = 0; i < candidates; ++i) {
    node_of[i] = tree::is_selected(keys.data(), candidates, i, num_nodes - 1);
  }
  for (int i = 1; i < candidates; ++i) node_of[i] += node_of[i - 1];  // inclusive scan
  for (int i = 0; i < candidates; ++i) tree::write_kept_candidate(set, node_of.data(), i, out);
  tree::write_root(root_token, out);
  build_one_tree_host(out.parents, depth, tree_mask, paths, num_nodes, words, width);
}

}  // namespace

cudaError_t launch_build_tree(const int32_t* parents, int32_t* depth, int32_t* tree_mask,
                              int32_t* paths, int64_t batch, int64_t num_nodes,
                              int64_t max_depth, cudaStream_t stream) {
  if (tree::size_error(batch, num_nodes, max_depth) != nullptr) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const int words = static_cast<int>(ceil_div(num_nodes, kMaskWordBits));
  const size_t shared_bytes = static_cast<size_t>(shared_span(num_nodes, sizeof(int32_t)));
  build_tree_kernel<<<static_cast<unsigned>(batch), tree_threads(num_nodes), shared_bytes,
                      stream>>>(parents, depth, tree_mask, paths, static_cast<int>(num_nodes),
                                words, static_cast<int>(max_depth + 1));
  return cudaGetLastError();
}

void build_tree_host(const int32_t* parents, int32_t* depth, int32_t* tree_mask, int32_t* paths,
                     int64_t batch, int64_t num_nodes, int64_t max_depth) {
  if (tree::size_error(batch, num_nodes, max_depth) != nullptr) return;  // bindings raise first
  const int nodes = static_cast<int>(num_nodes);
  const int words = static_cast<int>(ceil_div(num_nodes, kMaskWordBits));
  const int width = static_cast<int>(max_depth + 1);
  for (int64_t b = 0; b < batch; ++b) {
    build_one_tree_host(parents + b * nodes, depth + b * nodes, tree_mask + b * nodes * words,
                        paths + b * nodes * width, nodes, words, width);
  }
}

cudaError_t launch_eagle2_rerank(const int64_t* root_tokens, const int64_t* cand_tokens,
                                 const float* cand_scores, const int32_t* cand_parents,
                                 int64_t* tokens, int32_t* parents, int32_t* depth, float* scores,
                                 int32_t* tree_mask, int32_t* paths, int64_t* selected,
                                 int64_t batch, int64_t candidates, int64_t num_nodes,
                                 int64_t max_depth, cudaStream_t stream) {
  if (tree::rerank_size_error(batch, candidates, num_nodes, max_depth) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0) return cudaSuccess;
  const int words = static_cast<int>(ceil_div(num_nodes, kMaskWordBits));
  const size_t shared_bytes = static_cast<size_t>(shared_span(candidates, sizeof(int64_t)) +
                                                 shared_span(candidates, sizeof(int32_t)) +
                                                 shared_span(num_nodes, sizeof(int32_t)));
  rerank_kernel<<<static_cast<unsigned>(batch), 256, shared_bytes, stream>>>(
      root_tokens, cand_tokens, cand_scores, cand_parents, tokens, parents, depth, scores,
      tree_mask, paths, selected, static_cast<int>(candidates), static_cast<int>(num_nodes),
      words, static_cast<int>(max_depth + 1));
  return cudaGetLastError();
}

void eagle2_rerank_host(const int64_t* root_tokens, const int64_t* cand_tokens,
                        const float* cand_scores, const int32_t* cand_parents, int64_t* tokens,
                        int32_t* parents, int32_t* depth, float* scores, int32_t* tree_mask,
                        int32_t* paths, int64_t* selected, int64_t batch, int64_t candidates,
                        int64_t num_nodes, int64_t max_depth) {
  if (tree::rerank_size_error(batch, candidates, num_nodes, max_depth) != nullptr) return;
  const int nodes = static_cast<int>(num_nodes);
  const int words = static_cast<int>(ceil_div(num_nodes, kMaskWordBits));
  const int width = static_cast<int>(max_depth + 1);
  for (int64_t b = 0; b < batch; ++b) {
    const tree::CandidateSet set{cand_tokens + b * candidates, cand_scores + b * candidates,
                                 cand_parents + b * candidates, candidates};
    const tree::TreeOut out{tokens + b * nodes, parents + b * nodes, scores + b * nodes,
                            selected + b * (nodes - 1)};
    rerank_one_host(root_tokens[b], set, out, depth + b * nodes, tree_mask + b * nodes * words,
                    paths + b * nodes * width, nodes, words, width);
  }
}

}  // namespace eagle_kernels
