/**
 * @file acceptance_bindings.cpp
 * @brief Python bindings of the acceptance family (csrc/acceptance.cu).
 */
#include <cstdint>

#include <pybind11/pybind11.h>

#include "acceptance.cuh"
#include "binding_utils.h"

namespace eagle_kernels {
namespace {

namespace py = pybind11;
using bindings::as_ptr;

constexpr const char* kArgmaxDoc = R"doc(
Row argmax of a [rows, vocab] logits tensor into [rows] int64 (GPU, queued on ``stream``).

Ties go to the lowest index and NaN counts as the largest value (first NaN wins), exactly like
``torch.argmax``.

Parameters
----------
logits_ptr : int
    Address of contiguous [rows, vocab] logits.
out_ptr : int
    Address of [rows] int64 output.
rows, vocab : int
    rows >= 0, vocab >= 1.
dtype_code : int
    0 float32, 1 float16, 2 bfloat16.
stream : int
    ``torch.cuda.Stream.cuda_stream``.
)doc";

constexpr const char* kAcceptDoc = R"doc(
Greedy acceptance of B draft trees given the target argmax at every node (GPU, on ``stream``).

Equals ``eagle_kernels.ops.reference.greedy_accept_tree`` with ``target_ids =
target_logits.argmax(-1)``. Path row r accepts the longest prefix with ``tokens[path[j + 1]] ==
target_ids[path[j]]`` (``path[j + 1] >= 0``); padding rows (``path[0] < 0``) score -1; the best
row has the largest count, ties to the lowest row. If no row is valid (the reference raises)
the result is "root only": 0 accepted, bonus ``target_ids[b, 0]``.

Parameters
----------
tokens_ptr : int
    [B, N] int64 tree tokens.
paths_ptr : int
    [B, P, W] int32 root-to-leaf node indices, -1 padded.
target_ids_ptr : int
    [B, N] int64 target argmax at each node.
output_tokens_ptr : int
    [B, W] int64 output: accepted draft tokens, the bonus token, then -1.
num_accepted_ptr : int
    [B] int32 output: draft tokens accepted (bonus excluded).
accepted_nodes_ptr : int
    [B, W] int32 output: root, the accepted nodes, then -1.
batch, num_nodes, num_paths, width : int
    B >= 0, N >= 1, P >= 0, W >= 1.
stream : int
    ``torch.cuda.Stream.cuda_stream``.
)doc";

void argmax_rows(std::uintptr_t logits, std::uintptr_t out, int64_t rows, int64_t vocab,
                 int dtype_code, std::uintptr_t stream) {
  bindings::check_sizes(acceptance::argmax_size_error(rows, vocab, dtype_code));
  if (rows == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(logits), "argmax_rows");
  bindings::check_cuda(launch_argmax_rows(as_ptr<const void>(logits), as_ptr<int64_t>(out), rows,
                                          vocab, dtype_code, bindings::as_stream(stream)),
                       "argmax_rows");
}

void argmax_rows_on_host(std::uintptr_t logits, std::uintptr_t out, int64_t rows, int64_t vocab,
                         int dtype_code) {
  bindings::check_sizes(acceptance::argmax_size_error(rows, vocab, dtype_code));
  py::gil_scoped_release release;
  argmax_rows_host(as_ptr<const void>(logits), as_ptr<int64_t>(out), rows, vocab, dtype_code);
}

void greedy_accept_paths(std::uintptr_t tokens, std::uintptr_t paths, std::uintptr_t target_ids,
                         std::uintptr_t output_tokens, std::uintptr_t num_accepted,
                         std::uintptr_t accepted_nodes, int64_t batch, int64_t num_nodes,
                         int64_t num_paths, int64_t width, std::uintptr_t stream) {
  bindings::check_sizes(acceptance::accept_size_error(batch, num_nodes, num_paths, width));
  if (batch == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(tokens), "greedy_accept_paths");
  bindings::check_cuda(
      launch_greedy_accept_paths(as_ptr<const int64_t>(tokens), as_ptr<const int32_t>(paths),
                                 as_ptr<const int64_t>(target_ids), as_ptr<int64_t>(output_tokens),
                                 as_ptr<int32_t>(num_accepted), as_ptr<int32_t>(accepted_nodes),
                                 batch, num_nodes, num_paths, width, bindings::as_stream(stream)),
      "greedy_accept_paths");
}

void greedy_accept_paths_on_host(std::uintptr_t tokens, std::uintptr_t paths,
                                 std::uintptr_t target_ids, std::uintptr_t output_tokens,
                                 std::uintptr_t num_accepted, std::uintptr_t accepted_nodes,
                                 int64_t batch, int64_t num_nodes, int64_t num_paths,
                                 int64_t width) {
  bindings::check_sizes(acceptance::accept_size_error(batch, num_nodes, num_paths, width));
  py::gil_scoped_release release;
  greedy_accept_paths_host(as_ptr<const int64_t>(tokens), as_ptr<const int32_t>(paths),
                           as_ptr<const int64_t>(target_ids), as_ptr<int64_t>(output_tokens),
                           as_ptr<int32_t>(num_accepted), as_ptr<int32_t>(accepted_nodes), batch,
                           num_nodes, num_paths, width);
}

}  // namespace

void register_acceptance(py::module_& module) {
  module.def("argmax_rows", &argmax_rows, kArgmaxDoc, py::arg("logits_ptr"), py::arg("out_ptr"),
             py::arg("rows"), py::arg("vocab"), py::arg("dtype_code"), py::arg("stream"));
  module.def("argmax_rows_host", &argmax_rows_on_host,
             "``argmax_rows`` on CPU addresses, run synchronously by the kernel's comparison "
             "code (float32, float16 and bfloat16): same arguments minus ``stream``.",
             py::arg("logits_ptr"), py::arg("out_ptr"), py::arg("rows"), py::arg("vocab"),
             py::arg("dtype_code"));
  module.def("greedy_accept_paths", &greedy_accept_paths, kAcceptDoc, py::arg("tokens_ptr"),
             py::arg("paths_ptr"), py::arg("target_ids_ptr"), py::arg("output_tokens_ptr"),
             py::arg("num_accepted_ptr"), py::arg("accepted_nodes_ptr"), py::arg("batch"),
             py::arg("num_nodes"), py::arg("num_paths"), py::arg("width"), py::arg("stream"));
  module.def("greedy_accept_paths_host", &greedy_accept_paths_on_host,
             "``greedy_accept_paths`` on CPU addresses, run synchronously by the kernel's "
             "per-path code: same arguments minus ``stream``.",
             py::arg("tokens_ptr"), py::arg("paths_ptr"), py::arg("target_ids_ptr"),
             py::arg("output_tokens_ptr"), py::arg("num_accepted_ptr"),
             py::arg("accepted_nodes_ptr"), py::arg("batch"), py::arg("num_nodes"),
             py::arg("num_paths"), py::arg("width"));
}

}  // namespace eagle_kernels
