/**
 * @file tree.cu
 * @brief build_tree kernel, its launcher and the host entry point (see tree.cuh).
 *
 * One block per tree. Threads stride over nodes three times:
 *   1. leaf flags in shared memory (every node starts as a leaf; a child clears its parent),
 *      plus each node's depth and mask row, which need nothing but `parents`;
 *   2. an in-place inclusive scan of the flags gives each leaf its path row;
 *   3. each leaf writes its path row, and the rows past the leaf count are filled with -1.
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

__global__ void build_tree_kernel(const int32_t* __restrict__ parents, int32_t* __restrict__ depth,
                                  int32_t* __restrict__ tree_mask, int32_t* __restrict__ paths,
                                  int num_nodes, int words, int width) {
  extern __shared__ int32_t leaf_rank[];  // [num_nodes] leaf flags, then inclusive ranks
  __shared__ int32_t warp_totals[32];
  const int64_t tree_index = blockIdx.x;
  const int32_t* tree_parents = parents + tree_index * num_nodes;
  int32_t* tree_depth = depth + tree_index * num_nodes;
  int32_t* tree_masks = tree_mask + tree_index * num_nodes * words;
  int32_t* tree_paths = paths + tree_index * num_nodes * width;

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
    tree::write_path_row(tree_parents, node, tree_depth[node], width, row);
  }
  const int64_t padding = int64_t(num_nodes - num_leaves) * width;
  int32_t* padding_rows = tree_paths + int64_t(num_leaves) * width;
  for (int64_t i = threadIdx.x; i < padding; i += blockDim.x) padding_rows[i] = -1;
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

}  // namespace

cudaError_t launch_build_tree(const int32_t* parents, int32_t* depth, int32_t* tree_mask,
                              int32_t* paths, int64_t batch, int64_t num_nodes,
                              int64_t max_depth, cudaStream_t stream) {
  if (tree::size_error(batch, num_nodes, max_depth) != nullptr) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const int words = static_cast<int>(ceil_div(num_nodes, kMaskWordBits));
  const size_t shared_bytes = sizeof(int32_t) * static_cast<size_t>(num_nodes);
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

}  // namespace eagle_kernels
