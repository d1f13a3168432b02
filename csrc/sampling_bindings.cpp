/**
 * @file sampling_bindings.cpp
 * @brief Python bindings of the sampling family (csrc/sampling.cu): row_stats, target_probs,
 *        stochastic_accept_tree, stochastic_accept_chain, each with a *_host twin.
 *
 * Sampling parameters are device (or, for the twins, CPU) arrays: temperature float32,
 * top_k int32 (0 disables, clamped to <= vocab by the caller), top_p float32 (>= 1 disables).
 */
#include <cstdint>

#include <pybind11/pybind11.h>

#include "binding_utils.h"
#include "sampling.cuh"

namespace eagle_kernels {
namespace {

namespace py = pybind11;
using bindings::as_ptr;
using Address = std::uintptr_t;

constexpr const char* kRowStatsDoc = R"doc(
Per-row statistics of [rows, vocab] logits for sort-free sampling (GPU, queued on ``stream``):
m (row max of logits / temperature), kkey (order key of the k-th largest), tau (top-p
threshold on exp(s - m)), z (normaliser), each [rows]: float32, int32, float32, float32.
Parameters come from entry ``row // rows_per_param`` of temperature [P] float32, top_k [P]
int32 and top_p [P] float32. dtype_code: 0 float32, 1 float16, 2 bfloat16.
)doc";

constexpr const char* kTargetProbsDoc = R"doc(
``eagle_kernels.ops.reference.target_probs`` of [rows, vocab] logits into [rows, vocab]
float32 (GPU, on ``stream``); temperature / top_k / top_p are [rows] float32 / int32 / float32.
)doc";

constexpr const char* kTreeDoc = R"doc(
``eagle_kernels.ops.reference.stochastic_accept_tree`` (GPU, on ``stream``), given the
``row_stats`` of all B * N node rows (rows_per_param N). tokens [B, N] int64, parents [B, N]
int32, logits [B, N, V], accept_u [B, N] / bonus_u [B] float32, temperature [B] float32 ->
output_tokens [B, W] int64, num_accepted [B] int32, accepted_nodes [B, W] int32. N <= 2048.
)doc";

constexpr const char* kChainDoc = R"doc(
``eagle_kernels.ops.reference.stochastic_accept_chain`` (GPU, on ``stream``), given the
``row_stats`` of all B * N node rows; draft_probs [B, N - 1, V] float32; outputs of widths N.
)doc";

void row_stats(Address logits, Address m, Address kkey, Address tau, Address z, Address temp,
               Address top_k, Address top_p, int64_t rows, int64_t vocab, int64_t rows_per_param,
               int dtype_code, Address stream) {
  bindings::check_sizes(sampling::size_error(rows, vocab, dtype_code));
  if (rows_per_param < 1) throw py::value_error("row_stats: rows_per_param must be >= 1");
  if (rows == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(logits), "row_stats");
  bindings::check_cuda(
      launch_row_stats(as_ptr<const void>(logits), as_ptr<float>(m), as_ptr<int32_t>(kkey),
                       as_ptr<float>(tau), as_ptr<float>(z), as_ptr<const float>(temp),
                       as_ptr<const int32_t>(top_k), as_ptr<const float>(top_p), rows, vocab,
                       rows_per_param, dtype_code, bindings::as_stream(stream)),
      "row_stats");
}

void row_stats_on_host(Address logits, Address m, Address kkey, Address tau, Address z,
                       Address temp, Address top_k, Address top_p, int64_t rows, int64_t vocab,
                       int64_t rows_per_param, int dtype_code) {
  bindings::check_sizes(sampling::size_error(rows, vocab, dtype_code));
  if (rows_per_param < 1) throw py::value_error("row_stats: rows_per_param must be >= 1");
  py::gil_scoped_release release;
  row_stats_host(as_ptr<const void>(logits), as_ptr<float>(m), as_ptr<int32_t>(kkey),
                 as_ptr<float>(tau), as_ptr<float>(z), as_ptr<const float>(temp),
                 as_ptr<const int32_t>(top_k), as_ptr<const float>(top_p), rows, vocab,
                 rows_per_param, dtype_code);
}

void target_probs(Address logits, Address out, Address temp, Address top_k, Address top_p,
                  int64_t rows, int64_t vocab, int dtype_code, Address stream) {
  bindings::check_sizes(sampling::size_error(rows, vocab, dtype_code));
  if (rows == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(logits), "target_probs");
  bindings::check_cuda(
      launch_target_probs(as_ptr<const void>(logits), as_ptr<float>(out),
                          as_ptr<const float>(temp), as_ptr<const int32_t>(top_k),
                          as_ptr<const float>(top_p), rows, vocab, dtype_code,
                          bindings::as_stream(stream)),
      "target_probs");
}

void target_probs_on_host(Address logits, Address out, Address temp, Address top_k,
                          Address top_p, int64_t rows, int64_t vocab, int dtype_code) {
  bindings::check_sizes(sampling::size_error(rows, vocab, dtype_code));
  py::gil_scoped_release release;
  target_probs_host(as_ptr<const void>(logits), as_ptr<float>(out), as_ptr<const float>(temp),
                    as_ptr<const int32_t>(top_k), as_ptr<const float>(top_p), rows, vocab,
                    dtype_code);
}

void accept_tree(Address tokens, Address parents, Address logits, Address accept_u,
                 Address bonus_u, Address m, Address kkey, Address tau, Address z, Address temp,
                 Address output_tokens, Address num_accepted, Address accepted_nodes,
                 int64_t batch, int64_t num_nodes, int64_t vocab, int64_t width, int dtype_code,
                 Address stream) {
  bindings::check_sizes(sampling::accept_size_error(batch, num_nodes, vocab, width, dtype_code));
  if (batch == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(tokens), "stochastic_accept_tree");
  bindings::check_cuda(
      launch_stochastic_accept_tree(
          as_ptr<const int64_t>(tokens), as_ptr<const int32_t>(parents),
          as_ptr<const void>(logits), as_ptr<const float>(accept_u),
          as_ptr<const float>(bonus_u), as_ptr<const float>(m), as_ptr<const int32_t>(kkey),
          as_ptr<const float>(tau), as_ptr<const float>(z), as_ptr<const float>(temp),
          as_ptr<int64_t>(output_tokens), as_ptr<int32_t>(num_accepted),
          as_ptr<int32_t>(accepted_nodes), batch, num_nodes, vocab, width, dtype_code,
          bindings::as_stream(stream)),
      "stochastic_accept_tree");
}

void accept_tree_on_host(Address tokens, Address parents, Address logits, Address accept_u,
                         Address bonus_u, Address m, Address kkey, Address tau, Address z,
                         Address temp, Address output_tokens, Address num_accepted,
                         Address accepted_nodes, int64_t batch, int64_t num_nodes,
                         int64_t vocab, int64_t width, int dtype_code) {
  bindings::check_sizes(sampling::accept_size_error(batch, num_nodes, vocab, width, dtype_code));
  py::gil_scoped_release release;
  stochastic_accept_tree_host(
      as_ptr<const int64_t>(tokens), as_ptr<const int32_t>(parents), as_ptr<const void>(logits),
      as_ptr<const float>(accept_u), as_ptr<const float>(bonus_u), as_ptr<const float>(m),
      as_ptr<const int32_t>(kkey), as_ptr<const float>(tau), as_ptr<const float>(z),
      as_ptr<const float>(temp), as_ptr<int64_t>(output_tokens), as_ptr<int32_t>(num_accepted),
      as_ptr<int32_t>(accepted_nodes), batch, num_nodes, vocab, width, dtype_code);
}

void accept_chain(Address tokens, Address draft_probs, Address logits, Address accept_u,
                  Address bonus_u, Address m, Address kkey, Address tau, Address z, Address temp,
                  Address output_tokens, Address num_accepted, Address accepted_nodes,
                  int64_t batch, int64_t num_nodes, int64_t vocab, int dtype_code,
                  Address stream) {
  bindings::check_sizes(
      sampling::accept_size_error(batch, num_nodes, vocab, num_nodes, dtype_code));
  if (batch == 0) return;
  bindings::DeviceGuard guard(as_ptr<const void>(tokens), "stochastic_accept_chain");
  bindings::check_cuda(
      launch_stochastic_accept_chain(
          as_ptr<const int64_t>(tokens), as_ptr<const float>(draft_probs),
          as_ptr<const void>(logits), as_ptr<const float>(accept_u),
          as_ptr<const float>(bonus_u), as_ptr<const float>(m), as_ptr<const int32_t>(kkey),
          as_ptr<const float>(tau), as_ptr<const float>(z), as_ptr<const float>(temp),
          as_ptr<int64_t>(output_tokens), as_ptr<int32_t>(num_accepted),
          as_ptr<int32_t>(accepted_nodes), batch, num_nodes, vocab, dtype_code,
          bindings::as_stream(stream)),
      "stochastic_accept_chain");
}

void accept_chain_on_host(Address tokens, Address draft_probs, Address logits, Address accept_u,
                          Address bonus_u, Address m, Address kkey, Address tau, Address z,
                          Address temp, Address output_tokens, Address num_accepted,
                          Address accepted_nodes, int64_t batch, int64_t num_nodes,
                          int64_t vocab, int dtype_code) {
  bindings::check_sizes(
      sampling::accept_size_error(batch, num_nodes, vocab, num_nodes, dtype_code));
  py::gil_scoped_release release;
  stochastic_accept_chain_host(
      as_ptr<const int64_t>(tokens), as_ptr<const float>(draft_probs),
      as_ptr<const void>(logits), as_ptr<const float>(accept_u), as_ptr<const float>(bonus_u),
      as_ptr<const float>(m), as_ptr<const int32_t>(kkey), as_ptr<const float>(tau),
      as_ptr<const float>(z), as_ptr<const float>(temp), as_ptr<int64_t>(output_tokens),
      as_ptr<int32_t>(num_accepted), as_ptr<int32_t>(accepted_nodes), batch, num_nodes, vocab,
      dtype_code);
}

#define EK_HOST_NOTE                                                                  \
  " on CPU addresses, run synchronously by the kernel's own per-row / per-sequence code: " \
  "same arguments minus ``stream``."

}  // namespace

void register_sampling(py::module_& module) {
  // Largest tree / chain of the stochastic acceptance kernels, read by ops/acceptance.py.
  module.attr("STOCHASTIC_ACCEPT_MAX_NODES") = sampling::kMaxNodes;
  module.def("row_stats", &row_stats, kRowStatsDoc, py::arg("logits_ptr"), py::arg("m_ptr"),
             py::arg("kkey_ptr"), py::arg("tau_ptr"), py::arg("z_ptr"),
             py::arg("temperature_ptr"), py::arg("top_k_ptr"), py::arg("top_p_ptr"),
             py::arg("rows"), py::arg("vocab"), py::arg("rows_per_param"),
             py::arg("dtype_code"), py::arg("stream"));
  module.def("row_stats_host", &row_stats_on_host,
             "``row_stats``" EK_HOST_NOTE, py::arg("logits_ptr"),
             py::arg("m_ptr"), py::arg("kkey_ptr"), py::arg("tau_ptr"), py::arg("z_ptr"),
             py::arg("temperature_ptr"), py::arg("top_k_ptr"), py::arg("top_p_ptr"),
             py::arg("rows"), py::arg("vocab"), py::arg("rows_per_param"),
             py::arg("dtype_code"));
  module.def("target_probs", &target_probs, kTargetProbsDoc, py::arg("logits_ptr"),
             py::arg("out_ptr"), py::arg("temperature_ptr"), py::arg("top_k_ptr"),
             py::arg("top_p_ptr"), py::arg("rows"), py::arg("vocab"), py::arg("dtype_code"),
             py::arg("stream"));
  module.def("target_probs_host", &target_probs_on_host,
             "``target_probs``" EK_HOST_NOTE, py::arg("logits_ptr"),
             py::arg("out_ptr"), py::arg("temperature_ptr"), py::arg("top_k_ptr"),
             py::arg("top_p_ptr"), py::arg("rows"), py::arg("vocab"), py::arg("dtype_code"));
  module.def("stochastic_accept_tree", &accept_tree, kTreeDoc, py::arg("tokens_ptr"),
             py::arg("parents_ptr"), py::arg("logits_ptr"), py::arg("accept_u_ptr"),
             py::arg("bonus_u_ptr"), py::arg("m_ptr"), py::arg("kkey_ptr"), py::arg("tau_ptr"),
             py::arg("z_ptr"), py::arg("temperature_ptr"), py::arg("output_tokens_ptr"),
             py::arg("num_accepted_ptr"), py::arg("accepted_nodes_ptr"), py::arg("batch"),
             py::arg("num_nodes"), py::arg("vocab"), py::arg("width"), py::arg("dtype_code"),
             py::arg("stream"));
  module.def("stochastic_accept_tree_host", &accept_tree_on_host,
             "``stochastic_accept_tree``" EK_HOST_NOTE,
             py::arg("tokens_ptr"), py::arg("parents_ptr"), py::arg("logits_ptr"),
             py::arg("accept_u_ptr"), py::arg("bonus_u_ptr"), py::arg("m_ptr"),
             py::arg("kkey_ptr"), py::arg("tau_ptr"), py::arg("z_ptr"),
             py::arg("temperature_ptr"), py::arg("output_tokens_ptr"),
             py::arg("num_accepted_ptr"), py::arg("accepted_nodes_ptr"), py::arg("batch"),
             py::arg("num_nodes"), py::arg("vocab"), py::arg("width"), py::arg("dtype_code"));
  module.def("stochastic_accept_chain", &accept_chain, kChainDoc, py::arg("tokens_ptr"),
             py::arg("draft_probs_ptr"), py::arg("logits_ptr"), py::arg("accept_u_ptr"),
             py::arg("bonus_u_ptr"), py::arg("m_ptr"), py::arg("kkey_ptr"), py::arg("tau_ptr"),
             py::arg("z_ptr"), py::arg("temperature_ptr"), py::arg("output_tokens_ptr"),
             py::arg("num_accepted_ptr"), py::arg("accepted_nodes_ptr"), py::arg("batch"),
             py::arg("num_nodes"), py::arg("vocab"), py::arg("dtype_code"), py::arg("stream"));
  module.def("stochastic_accept_chain_host", &accept_chain_on_host,
             "``stochastic_accept_chain``" EK_HOST_NOTE,
             py::arg("tokens_ptr"), py::arg("draft_probs_ptr"), py::arg("logits_ptr"),
             py::arg("accept_u_ptr"), py::arg("bonus_u_ptr"), py::arg("m_ptr"),
             py::arg("kkey_ptr"), py::arg("tau_ptr"), py::arg("z_ptr"),
             py::arg("temperature_ptr"), py::arg("output_tokens_ptr"),
             py::arg("num_accepted_ptr"), py::arg("accepted_nodes_ptr"), py::arg("batch"),
             py::arg("num_nodes"), py::arg("vocab"), py::arg("dtype_code"));
}

}  // namespace eagle_kernels
