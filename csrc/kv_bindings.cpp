/**
 * @file kv_bindings.cpp
 * @brief Python bindings of the kv op family (csrc/kv.cu).
 */
#include <cstdint>

#include <pybind11/pybind11.h>

#include "binding_utils.h"
#include "kv.cuh"

namespace eagle_kernels {
namespace {

namespace py = pybind11;
using bindings::as_ptr;

constexpr const char* kCompactDoc = R"doc(
Move every sequence's accepted K/V rows next to its prefix, in every cache, in one launch (GPU,
queued on ``stream``). Equals ``eagle_kernels.ops.reference.compact_kv``.

Parameters
----------
cache_addresses_ptr : int
    [num_caches] int64 device array: the address of each [B, max_len, H, D] cache.
row_words_ptr : int
    [num_caches] int64 device array: bytes per (b, position) row / word_bytes.
num_caches : int
cache_lens_ptr, accepted_nodes_ptr, num_accepted_ptr : int
    [B] int32, [B, width] int32 (root first, -1 padded), [B] int32.
batch, max_len, width : int
word_bytes : int
    1, 2, 4, 8 or 16: divides every row size and cache address.
max_row_words : int
    The largest row_words entry (sizes the grid).
stream : int
    ``torch.cuda.Stream.cuda_stream``.
)doc";

void compact_kv(std::uintptr_t addresses, std::uintptr_t row_words, int64_t num_caches,
                std::uintptr_t cache_lens, std::uintptr_t nodes, std::uintptr_t num_accepted,
                int64_t batch, int64_t max_len, int64_t width, int64_t word_bytes,
                int64_t max_row_words, std::uintptr_t stream) {
  bindings::check_sizes(
      kv::size_error(num_caches, batch, max_len, width, word_bytes, max_row_words));
  if (num_caches == 0 || batch == 0 || max_row_words == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(cache_lens), "compact_kv");
  bindings::check_cuda(
      launch_compact_kv(as_ptr<const int64_t>(addresses), as_ptr<const int64_t>(row_words),
                        num_caches, as_ptr<const int32_t>(cache_lens),
                        as_ptr<const int32_t>(nodes), as_ptr<const int32_t>(num_accepted), batch,
                        max_len, width, word_bytes, max_row_words, bindings::as_stream(stream)),
      "compact_kv");
}

void compact_kv_on_host(std::uintptr_t addresses, std::uintptr_t row_words, int64_t num_caches,
                        std::uintptr_t cache_lens, std::uintptr_t nodes,
                        std::uintptr_t num_accepted, int64_t batch, int64_t max_len,
                        int64_t width, int64_t word_bytes) {
  bindings::check_sizes(kv::size_error(num_caches, batch, max_len, width, word_bytes, 0));
  py::gil_scoped_release release;
  compact_kv_host(as_ptr<const int64_t>(addresses), as_ptr<const int64_t>(row_words),
                  num_caches, as_ptr<const int32_t>(cache_lens), as_ptr<const int32_t>(nodes),
                  as_ptr<const int32_t>(num_accepted), batch, max_len, width, word_bytes);
}

}  // namespace

void register_kv(py::module_& module) {
  module.def("compact_kv", &compact_kv, kCompactDoc, py::arg("cache_addresses_ptr"),
             py::arg("row_words_ptr"), py::arg("num_caches"), py::arg("cache_lens_ptr"),
             py::arg("accepted_nodes_ptr"), py::arg("num_accepted_ptr"), py::arg("batch"),
             py::arg("max_len"), py::arg("width"), py::arg("word_bytes"),
             py::arg("max_row_words"), py::arg("stream"));
  module.def("compact_kv_host", &compact_kv_on_host,
             "``compact_kv`` on CPU addresses (the address and row-size tables are host arrays "
             "too), run synchronously by the kernel's per-column code: same arguments minus "
             "``max_row_words`` and ``stream``.",
             py::arg("cache_addresses_ptr"), py::arg("row_words_ptr"), py::arg("num_caches"),
             py::arg("cache_lens_ptr"), py::arg("accepted_nodes_ptr"), py::arg("num_accepted_ptr"),
             py::arg("batch"), py::arg("max_len"), py::arg("width"), py::arg("word_bytes"));
}

}  // namespace eagle_kernels
