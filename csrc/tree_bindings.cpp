/**
 * @file tree_bindings.cpp
 * @brief Python bindings of the tree-construction family (csrc/tree.cu).
 */
#include <cstdint>

#include <pybind11/pybind11.h>

#include "binding_utils.h"
#include "tree.cuh"

namespace eagle_kernels {
namespace {

namespace py = pybind11;
using bindings::as_ptr;

constexpr const char* kBuildTreeDoc = R"doc(
Depth, packed ancestor mask and root-to-leaf paths of B topologically ordered trees (GPU).

Contract: ``eagle_kernels.ops.reference.build_tree``. Arguments are raw addresses of
contiguous CUDA tensors (``Tensor.data_ptr()``) and a stream handle; the call only queues the
kernel on that stream.

Parameters
----------
parents_ptr : int
    [B, N] int32; ``parents[b, 0] == -1``, ``0 <= parents[b, i] < i``.
depth_ptr : int
    [B, N] int32 output, root 0.
tree_mask_ptr : int
    [B, N, ceil(N / 32)] int32 output; node j is bit ``j % 32`` of word ``j // 32``.
paths_ptr : int
    [B, N, max_depth + 1] int32 output; one row per leaf (ascending leaf index), root first,
    padded with -1; rows past the leaf count are all -1.
batch, num_nodes, max_depth : int
    B (>= 0), N (1..8192) and D (>= the depth of every node).
stream : int
    ``torch.cuda.Stream.cuda_stream`` to launch on.

Raises
------
ValueError
    Sizes out of range, or ``parents_ptr`` is not device memory.
RuntimeError
    The launch failed (message carries the CUDA error string).
)doc";

constexpr const char* kBuildTreeHostDoc = R"doc(
``build_tree`` on CPU addresses, run synchronously by the same per-node code as the kernel
(no GPU needed): same arguments minus ``stream``.
)doc";

void build_tree(std::uintptr_t parents, std::uintptr_t depth, std::uintptr_t tree_mask,
                std::uintptr_t paths, int64_t batch, int64_t num_nodes, int64_t max_depth,
                std::uintptr_t stream) {
  bindings::check_sizes(tree::size_error(batch, num_nodes, max_depth));
  if (batch == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(parents), "build_tree");
  bindings::check_cuda(
      launch_build_tree(as_ptr<const int32_t>(parents), as_ptr<int32_t>(depth),
                        as_ptr<int32_t>(tree_mask), as_ptr<int32_t>(paths), batch, num_nodes,
                        max_depth, bindings::as_stream(stream)),
      "build_tree");
}

void build_tree_on_host(std::uintptr_t parents, std::uintptr_t depth, std::uintptr_t tree_mask,
                        std::uintptr_t paths, int64_t batch, int64_t num_nodes,
                        int64_t max_depth) {
  bindings::check_sizes(tree::size_error(batch, num_nodes, max_depth));
  py::gil_scoped_release release;
  build_tree_host(as_ptr<const int32_t>(parents), as_ptr<int32_t>(depth),
                  as_ptr<int32_t>(tree_mask), as_ptr<int32_t>(paths), batch, num_nodes,
                  max_depth);
}

constexpr const char* kRerankDoc = R"doc(
Best N - 1 of M draft candidates -> B whole draft trees in one launch (GPU); contract:
``eagle_kernels.ops.reference.eagle2_rerank``. A kept candidate whose parent was not kept gets
parent -1 (the Python op raises the reference's ValueError on it).

Parameters (raw addresses of contiguous CUDA tensors)
----------
root_tokens_ptr [B] int64, cand_tokens_ptr [B, M] int64, cand_scores_ptr [B, M] float32,
cand_parents_ptr [B, M] int32 (-1: child of the root; otherwise < own index);
outputs tokens_ptr [B, N] int64, parents_ptr / depth_ptr [B, N] int32, scores_ptr [B, N]
float32, tree_mask_ptr [B, N, ceil(N / 32)] int32, paths_ptr [B, N, max_depth + 1] int32,
selected_ptr [B, N - 1] int64;
batch, candidates, num_nodes, max_depth : B >= 0, 1 <= M <= 2048, 1 <= N <= M + 1, D >= 0;
stream : ``torch.cuda.Stream.cuda_stream``.
)doc";

constexpr const char* kRerankHostDoc = R"doc(
``eagle2_rerank`` on CPU addresses, run synchronously by the kernel's own per-candidate and
per-node code (no GPU needed): same arguments minus ``stream``.
)doc";

void eagle2_rerank(std::uintptr_t root_tokens, std::uintptr_t cand_tokens,
                   std::uintptr_t cand_scores, std::uintptr_t cand_parents, std::uintptr_t tokens,
                   std::uintptr_t parents, std::uintptr_t depth, std::uintptr_t scores,
                   std::uintptr_t tree_mask, std::uintptr_t paths, std::uintptr_t selected,
                   int64_t batch, int64_t candidates, int64_t num_nodes, int64_t max_depth,
                   std::uintptr_t stream) {
  bindings::check_sizes(tree::rerank_size_error(batch, candidates, num_nodes, max_depth));
  if (batch == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(cand_scores), "eagle2_rerank");
  bindings::check_cuda(
      launch_eagle2_rerank(as_ptr<const int64_t>(root_tokens), as_ptr<const int64_t>(cand_tokens),
                           as_ptr<const float>(cand_scores), as_ptr<const int32_t>(cand_parents),
                           as_ptr<int64_t>(tokens), as_ptr<int32_t>(parents),
                           as_ptr<int32_t>(depth), as_ptr<float>(scores),
                           as_ptr<int32_t>(tree_mask), as_ptr<int32_t>(paths),
                           as_ptr<int64_t>(selected), batch, candidates, num_nodes, max_depth,
                           bindings::as_stream(stream)),
      "eagle2_rerank");
}

void eagle2_rerank_on_host(std::uintptr_t root_tokens, std::uintptr_t cand_tokens,
                           std::uintptr_t cand_scores, std::uintptr_t cand_parents,
                           std::uintptr_t tokens, std::uintptr_t parents, std::uintptr_t depth,
                           std::uintptr_t scores, std::uintptr_t tree_mask, std::uintptr_t paths,
                           std::uintptr_t selected, int64_t batch, int64_t candidates,
                           int64_t num_nodes, int64_t max_depth) {
  bindings::check_sizes(tree::rerank_size_error(batch, candidates, num_nodes, max_depth));
  py::gil_scoped_release release;
  eagle2_rerank_host(as_ptr<const int64_t>(root_tokens), as_ptr<const int64_t>(cand_tokens),
                     as_ptr<const float>(cand_scores), as_ptr<const int32_t>(cand_parents),
                     as_ptr<int64_t>(tokens), as_ptr<int32_t>(parents), as_ptr<int32_t>(depth),
                     as_ptr<float>(scores), as_ptr<int32_t>(tree_mask), as_ptr<int32_t>(paths),
                     as_ptr<int64_t>(selected), batch, candidates, num_nodes, max_depth);
}

}  // namespace

void register_tree(py::module_& module) {
  // Size limits of the cuda backend, read by eagle_kernels/ops/{tree,topk}.py.
  module.attr("BUILD_TREE_MAX_NODES") = tree::kMaxNodes;
  module.attr("RERANK_MAX_CANDIDATES") = tree::kMaxCandidates;
  module.def("build_tree", &build_tree, kBuildTreeDoc, py::arg("parents_ptr"),
             py::arg("depth_ptr"), py::arg("tree_mask_ptr"), py::arg("paths_ptr"),
             py::arg("batch"), py::arg("num_nodes"), py::arg("max_depth"), py::arg("stream"));
  module.def("build_tree_host", &build_tree_on_host, kBuildTreeHostDoc, py::arg("parents_ptr"),
             py::arg("depth_ptr"), py::arg("tree_mask_ptr"), py::arg("paths_ptr"),
             py::arg("batch"), py::arg("num_nodes"), py::arg("max_depth"));
  module.def("eagle2_rerank", &eagle2_rerank, kRerankDoc, py::arg("root_tokens_ptr"),
             py::arg("cand_tokens_ptr"), py::arg("cand_scores_ptr"), py::arg("cand_parents_ptr"),
             py::arg("tokens_ptr"), py::arg("parents_ptr"), py::arg("depth_ptr"),
             py::arg("scores_ptr"), py::arg("tree_mask_ptr"), py::arg("paths_ptr"),
             py::arg("selected_ptr"), py::arg("batch"), py::arg("candidates"),
             py::arg("num_nodes"), py::arg("max_depth"), py::arg("stream"));
  module.def("eagle2_rerank_host", &eagle2_rerank_on_host, kRerankHostDoc,
             py::arg("root_tokens_ptr"), py::arg("cand_tokens_ptr"), py::arg("cand_scores_ptr"),
             py::arg("cand_parents_ptr"), py::arg("tokens_ptr"), py::arg("parents_ptr"),
             py::arg("depth_ptr"), py::arg("scores_ptr"), py::arg("tree_mask_ptr"),
             py::arg("paths_ptr"), py::arg("selected_ptr"), py::arg("batch"),
             py::arg("candidates"), py::arg("num_nodes"), py::arg("max_depth"));
}

}  // namespace eagle_kernels
