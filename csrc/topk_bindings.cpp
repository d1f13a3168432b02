/**
 * @file topk_bindings.cpp
 * @brief Python bindings of the topk op family (csrc/topk.cu): topk_log_softmax and
 *        eagle2_expand, each with a *_host twin on CPU addresses. (eagle2_rerank builds a tree
 *        and lives with build_tree in tree_bindings.cpp.)
 */
#include <cstdint>

#include <pybind11/pybind11.h>

#include "binding_utils.h"
#include "topk.cuh"

namespace eagle_kernels {
namespace {

namespace py = pybind11;
using bindings::as_ptr;

constexpr const char* kTopkDoc = R"doc(
Fused log-softmax + top-k over vocabulary rows (GPU); contract:
``eagle_kernels.ops.reference.topk_log_softmax`` (ids ranked by logit, see ops/topk.py).

Parameters
----------
logits_ptr : int
    [R, V] contiguous logits, dtype given by ``dtype_code`` (0 float32, 1 float16, 2 bfloat16).
d2t_ptr : int
    [V] int64 draft-to-target offsets, or 0 for none.
values_ptr, ids_ptr : int
    [R, k] float32 log-probs (descending) and [R, k] int64 ids (outputs).
rows, vocab, k : int
    R >= 0, V >= 1, 1 <= k <= min(V, 32).
stream : int
    ``torch.cuda.Stream.cuda_stream``.

Raises
------
ValueError
    Sizes out of range, or ``logits_ptr`` is not device memory.
RuntimeError
    The launch failed.
)doc";

constexpr const char* kExpandDoc = R"doc(
One EAGLE-2 expansion step for B trees (GPU); contract:
``eagle_kernels.ops.reference.eagle2_expand``.

Parameters
----------
frontier_ptr : int      [B, K] float32 frontier scores.
children_ptr : int      [B, K, C] float32 child log-probs.
candidates_ptr : int    [B, K*C] float32 output, frontier + child.
next_index_ptr : int    [B, top_k] int64 output, best first, ties by lowest index.
next_scores_ptr : int   [B, top_k] float32 output.
batch, frontier, children, top_k : int
    B >= 0, 1 <= K*C <= 6144, 1 <= top_k <= K*C.
stream : int
)doc";

constexpr const char* kHostDoc = R"doc(
The same computation on CPU addresses, run synchronously by the kernel's own per-thread /
per-candidate code (no GPU needed): same arguments minus ``stream``.
)doc";

void topk_log_softmax(std::uintptr_t logits, int dtype_code, std::uintptr_t d2t,
                      std::uintptr_t values, std::uintptr_t ids, int64_t rows, int64_t vocab,
                      int64_t k, std::uintptr_t stream) {
  bindings::check_sizes(topk::topk_size_error(rows, vocab, k, dtype_code));
  if (rows == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(logits), "topk_log_softmax");
  bindings::check_cuda(
      launch_topk_log_softmax(as_ptr<const void>(logits), dtype_code, as_ptr<const int64_t>(d2t),
                              as_ptr<float>(values), as_ptr<int64_t>(ids), rows, vocab, k,
                              bindings::as_stream(stream)),
      "topk_log_softmax");
}

void topk_log_softmax_on_host(std::uintptr_t logits, int dtype_code, std::uintptr_t d2t,
                              std::uintptr_t values, std::uintptr_t ids, int64_t rows,
                              int64_t vocab, int64_t k) {
  bindings::check_sizes(topk::topk_size_error(rows, vocab, k, dtype_code));
  py::gil_scoped_release release;
  topk_log_softmax_host(as_ptr<const void>(logits), dtype_code, as_ptr<const int64_t>(d2t),
                        as_ptr<float>(values), as_ptr<int64_t>(ids), rows, vocab, k);
}

void eagle2_expand(std::uintptr_t frontier, std::uintptr_t children, std::uintptr_t candidates,
                   std::uintptr_t next_index, std::uintptr_t next_scores, int64_t batch,
                   int64_t frontier_size, int64_t num_children, int64_t top_k,
                   std::uintptr_t stream) {
  bindings::check_sizes(topk::expand_size_error(batch, frontier_size, num_children, top_k));
  if (batch == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(frontier), "eagle2_expand");
  bindings::check_cuda(
      launch_eagle2_expand(as_ptr<const float>(frontier), as_ptr<const float>(children),
                           as_ptr<float>(candidates), as_ptr<int64_t>(next_index),
                           as_ptr<float>(next_scores), batch, frontier_size, num_children,
                           top_k, bindings::as_stream(stream)),
      "eagle2_expand");
}

void eagle2_expand_on_host(std::uintptr_t frontier, std::uintptr_t children,
                           std::uintptr_t candidates, std::uintptr_t next_index,
                           std::uintptr_t next_scores, int64_t batch, int64_t frontier_size,
                           int64_t num_children, int64_t top_k) {
  bindings::check_sizes(topk::expand_size_error(batch, frontier_size, num_children, top_k));
  py::gil_scoped_release release;
  eagle2_expand_host(as_ptr<const float>(frontier), as_ptr<const float>(children),
                     as_ptr<float>(candidates), as_ptr<int64_t>(next_index),
                     as_ptr<float>(next_scores), batch, frontier_size, num_children, top_k);
}

}  // namespace

void register_topk(py::module_& module) {
  // Size limits of the cuda backend, read by eagle_kernels/ops/topk.py (one source of truth).
  module.attr("TOPK_MAX_K") = topk::kMaxK;
  module.attr("EXPAND_MAX_CANDIDATES") = topk::kMaxExpand;
  module.def("topk_log_softmax", &topk_log_softmax, kTopkDoc, py::arg("logits_ptr"),
             py::arg("dtype_code"), py::arg("d2t_ptr"), py::arg("values_ptr"),
             py::arg("ids_ptr"), py::arg("rows"), py::arg("vocab"), py::arg("k"),
             py::arg("stream"));
  module.def("topk_log_softmax_host", &topk_log_softmax_on_host, kHostDoc,
             py::arg("logits_ptr"), py::arg("dtype_code"), py::arg("d2t_ptr"),
             py::arg("values_ptr"), py::arg("ids_ptr"), py::arg("rows"), py::arg("vocab"),
             py::arg("k"));
  module.def("eagle2_expand", &eagle2_expand, kExpandDoc, py::arg("frontier_ptr"),
             py::arg("children_ptr"), py::arg("candidates_ptr"), py::arg("next_index_ptr"),
             py::arg("next_scores_ptr"), py::arg("batch"), py::arg("frontier"),
             py::arg("children"), py::arg("top_k"), py::arg("stream"));
  module.def("eagle2_expand_host", &eagle2_expand_on_host, kHostDoc, py::arg("frontier_ptr"),
             py::arg("children_ptr"), py::arg("candidates_ptr"), py::arg("next_index_ptr"),
             py::arg("next_scores_ptr"), py::arg("batch"), py::arg("frontier"),
             py::arg("children"), py::arg("top_k"));
}

}  // namespace eagle_kernels
