/**
 * @file attention_bindings.cpp
 * @brief Python bindings of the attention op family (csrc/attention.cu).
 */
#include <cstdint>

#include <pybind11/pybind11.h>

#include "attention.cuh"
#include "binding_utils.h"

namespace eagle_kernels {
namespace {

namespace py = pybind11;
using bindings::as_ptr;

constexpr const char* kTreeAttentionDoc = R"doc(
Tree attention of Nq tree-node queries over each sequence's KV prefix plus their tree ancestors
(GPU, queued on ``stream``). Equals ``eagle_kernels.ops.reference.tree_attention``.

Parameters
----------
q_ptr, k_cache_ptr, v_cache_ptr : int
    [B, Nq, Hq, D] and [B, max_len, Hkv, D] float16 / bfloat16 (head dim contiguous, rows
    16-byte aligned).
cache_lens_ptr, tree_mask_ptr : int
    [B] int32 prefix lengths; [B, Nq, words] int32 packed visibility of the T tree keys.
out_ptr : int
    [B, Nq, Hq, D], dtype and strides of q (contiguous when num_splits > 1).
part_o_ptr, part_lse_ptr : int
    fp32 workspaces [B, S, Nq, Hq, D] and [B, S, Nq, Hq] (ignored when num_splits == 1).
batch, num_queries, q_heads, kv_heads, head_dim, tree_keys, words : int
    head_dim 64 or 128; words = ceil(tree_keys / 32).
stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh : int
    Element strides of q / out and of k_cache / v_cache.
num_splits : int
    1..256 key-range splits per sequence (split-KV; a second kernel merges them).
sm_scale : float
dtype_code : int
    1 float16, 2 bfloat16.
stream : int
    ``torch.cuda.Stream.cuda_stream``.
)doc";

attention::Problem make_problem(int64_t batch, int64_t num_queries, int64_t q_heads,
                                int64_t kv_heads, int64_t head_dim, int64_t tree_keys,
                                int64_t words, int64_t sqb, int64_t sqn, int64_t sqh,
                                int64_t skb, int64_t skn, int64_t skh, int64_t num_splits,
                                double sm_scale) {
  constexpr double kLog2e = 1.4426950408889634;
  return {batch, num_queries, q_heads, kv_heads, head_dim, tree_keys, words, sqb, sqn, sqh,
          skb, skn, skh, num_splits, static_cast<float>(sm_scale * kLog2e)};
}

void tree_attention(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t lens,
                    std::uintptr_t mask, std::uintptr_t out, std::uintptr_t part_o,
                    std::uintptr_t part_lse, int64_t batch, int64_t num_queries, int64_t q_heads,
                    int64_t kv_heads, int64_t head_dim, int64_t tree_keys, int64_t words,
                    int64_t sqb, int64_t sqn, int64_t sqh, int64_t skb, int64_t skn, int64_t skh,
                    int64_t num_splits, double sm_scale, int dtype_code, std::uintptr_t stream) {
  const attention::Problem problem =
      make_problem(batch, num_queries, q_heads, kv_heads, head_dim, tree_keys, words, sqb, sqn,
                   sqh, skb, skn, skh, num_splits, sm_scale);
  bindings::check_sizes(attention::size_error(problem, dtype_code));
  if (batch == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(q), "tree_attention");
  bindings::check_cuda(
      launch_tree_attention(as_ptr<const void>(q), as_ptr<const void>(k), as_ptr<const void>(v),
                            as_ptr<const int32_t>(lens), as_ptr<const int32_t>(mask),
                            as_ptr<void>(out), as_ptr<float>(part_o), as_ptr<float>(part_lse),
                            problem, dtype_code, bindings::as_stream(stream)),
      "tree_attention");
}

void tree_attention_on_host(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v,
                            std::uintptr_t lens, std::uintptr_t mask, std::uintptr_t out,
                            std::uintptr_t part_o, std::uintptr_t part_lse, int64_t batch,
                            int64_t num_queries, int64_t q_heads, int64_t kv_heads,
                            int64_t head_dim, int64_t tree_keys, int64_t words, int64_t sqb,
                            int64_t sqn, int64_t sqh, int64_t skb, int64_t skn, int64_t skh,
                            int64_t num_splits, double sm_scale, int dtype_code) {
  const attention::Problem problem =
      make_problem(batch, num_queries, q_heads, kv_heads, head_dim, tree_keys, words, sqb, sqn,
                   sqh, skb, skn, skh, num_splits, sm_scale);
  bindings::check_sizes(attention::size_error(problem, dtype_code));
  py::gil_scoped_release release;
  tree_attention_host(as_ptr<const void>(q), as_ptr<const void>(k), as_ptr<const void>(v),
                      as_ptr<const int32_t>(lens), as_ptr<const int32_t>(mask), as_ptr<void>(out),
                      as_ptr<float>(part_o), as_ptr<float>(part_lse), problem, dtype_code);
}

}  // namespace

void register_attention(py::module_& module) {
  // What the cuda kernel takes, read by eagle_kernels/ops/attention.py (dtype codes of
  // common.cuh: 1 float16, 2 bfloat16).
  module.attr("ATTENTION_HEAD_DIMS") = py::make_tuple(attention::kHeadDims[0],
                                                      attention::kHeadDims[1]);
  module.attr("ATTENTION_DTYPE_CODES") = py::make_tuple(static_cast<int>(kFloat16),
                                                        static_cast<int>(kBFloat16));
  module.def("tree_attention", &tree_attention, kTreeAttentionDoc, py::arg("q_ptr"),
             py::arg("k_cache_ptr"), py::arg("v_cache_ptr"), py::arg("cache_lens_ptr"),
             py::arg("tree_mask_ptr"), py::arg("out_ptr"), py::arg("part_o_ptr"),
             py::arg("part_lse_ptr"), py::arg("batch"), py::arg("num_queries"),
             py::arg("q_heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("tree_keys"),
             py::arg("words"), py::arg("stride_qb"), py::arg("stride_qn"), py::arg("stride_qh"),
             py::arg("stride_kb"), py::arg("stride_kn"), py::arg("stride_kh"),
             py::arg("num_splits"), py::arg("sm_scale"), py::arg("dtype_code"),
             py::arg("stream"));
  module.def("tree_attention_host", &tree_attention_on_host,
             "``tree_attention`` on CPU addresses, run synchronously by the kernel's tiling and "
             "per-row code with scalar dot products: same arguments minus ``stream``.",
             py::arg("q_ptr"), py::arg("k_cache_ptr"), py::arg("v_cache_ptr"),
             py::arg("cache_lens_ptr"), py::arg("tree_mask_ptr"), py::arg("out_ptr"),
             py::arg("part_o_ptr"), py::arg("part_lse_ptr"), py::arg("batch"),
             py::arg("num_queries"), py::arg("q_heads"), py::arg("kv_heads"),
             py::arg("head_dim"), py::arg("tree_keys"), py::arg("words"), py::arg("stride_qb"),
             py::arg("stride_qn"), py::arg("stride_qh"), py::arg("stride_kb"),
             py::arg("stride_kn"), py::arg("stride_kh"), py::arg("num_splits"),
             py::arg("sm_scale"), py::arg("dtype_code"));
}

}  // namespace eagle_kernels
