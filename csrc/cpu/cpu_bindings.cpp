/**
 * @file cpu_bindings.cpp
 * @brief pybind11 module eagle_kernels._cpu: the CPU kernels behind raw-pointer entry points.
 *
 * The instruction set is picked once at import: the best of avx512 / avx2 / generic this
 * processor (and OS) supports, or EAGLE_KERNELS_CPU_ISA to force one the processor has (tests
 * use it to compare them). Launchers in eagle_kernels/ops/ validate shapes, dtypes and devices
 * and pass data pointers; `threads` 0 means OpenMP's current maximum (torch.set_num_threads).
 * The GIL stays held during a call, so the per-process attention workspace needs no lock.
 */
#include <omp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.h"

namespace py = pybind11;
using eagle_kernels::cpu::KernelTable;
namespace cpu = eagle_kernels::cpu;

namespace {

template <typename T>
T* as_ptr(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

bool supports(const std::string& isa) {
  if (isa == "generic") return true;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == "avx2") return avx2;
  if (isa == "avx512") {
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  }
#endif
  return false;
}

const KernelTable& table_of(const std::string& isa) {
#if defined(__x86_64__)
  if (isa == "avx512") return cpu::avx512_kernels();
  if (isa == "avx2") return cpu::avx2_kernels();
#endif
  if (isa == "generic") return cpu::generic_kernels();
  throw std::invalid_argument("unknown instruction set " + isa);
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> found;
  for (const char* isa : {"avx512", "avx2", "generic"})
    if (supports(isa)) found.push_back(isa);
  return found;
}

const KernelTable* active = nullptr;

void select_isa(const std::string& isa) {
  if (!supports(isa)) {
    throw std::invalid_argument("EAGLE_KERNELS_CPU_ISA / isa: expected one of this processor's "
                                "instruction sets (avx512, avx2, generic as supported), got '" +
                                isa + "'");
  }
  active = &table_of(isa);
}

void select_default_isa() {
  const char* forced = std::getenv("EAGLE_KERNELS_CPU_ISA");
  if (forced != nullptr && *forced != '\0') {
    select_isa(forced);
    return;
  }
  select_isa(supported_isas().front());
}

int thread_count(int threads) { return threads > 0 ? threads : omp_get_max_threads(); }

std::vector<float> widening_workspace;

/// `threads` GEMM workspaces (widened panel blocks, block sums, quantized rows;
/// decoder_linear.h, linear_int8.h) for GEMMs over up to `k` and `m` rows.
float* linear_workspace(int threads, int64_t k, int64_t m) {
  const size_t floats = static_cast<size_t>(threads * cpu::linear_workspace_floats(k, m));
  if (widening_workspace.size() < floats) widening_workspace.resize(floats);
  return widening_workspace.data();
}

/// `segments`: per weight its pack (see packed_weight in kernels.h), bias (0: none), y, n, ldy.
void linear(std::uintptr_t x, int64_t m, int64_t k, int64_t ldx,
            const std::vector<int64_t>& segments, int threads) {
  if (segments.size() % 5 != 0) throw std::invalid_argument("segments: expected 5 ints each");
  std::vector<cpu::LinearSegment> parts;
  for (size_t i = 0; i < segments.size(); i += 5) {
    parts.push_back({cpu::packed_weight(static_cast<std::uintptr_t>(segments[i])),
                     as_ptr<const float>(segments[i + 1]),
                     as_ptr<float>(segments[i + 2]), segments[i + 3], segments[i + 4]});
  }
  const int count = thread_count(threads);
  float* widened = linear_workspace(count, k, m);
  cpu::LinearArgs args{as_ptr<const float>(x), m, k, ldx, parts.data(),
                       static_cast<int>(parts.size()), widened, count};
  active->linear(args);
}

void rms_norm(std::uintptr_t x, std::uintptr_t residual, std::uintptr_t sum_out,
              std::uintptr_t weight, std::uintptr_t y, int64_t rows, int64_t n, int64_t ldx,
              int64_t ldy, float eps, int threads) {
  cpu::RmsNormArgs args{as_ptr<const float>(x), as_ptr<const float>(residual),
                        as_ptr<float>(sum_out), as_ptr<const float>(weight), as_ptr<float>(y),
                        rows, n, ldx, ldy, eps, thread_count(threads)};
  active->rms_norm(args);
}

void silu_mul(std::uintptr_t gate, std::uintptr_t up, std::uintptr_t y, int64_t rows, int64_t n,
              int64_t ld_in, int64_t ld_out, int threads) {
  cpu::SiluMulArgs args{as_ptr<const float>(gate), as_ptr<const float>(up), as_ptr<float>(y),
                        rows, n, ld_in, ld_out, thread_count(threads)};
  active->silu_mul(args);
}

void rope(std::uintptr_t x, std::uintptr_t positions, std::uintptr_t cos, std::uintptr_t sin,
          int64_t rows, int64_t heads, int64_t head_dim, int64_t ldx, int64_t table_rows,
          int threads) {
  cpu::RopeArgs args{as_ptr<float>(x), as_ptr<const int64_t>(positions),
                     as_ptr<const float>(cos), as_ptr<const float>(sin), rows, heads, head_dim,
                     ldx, table_rows, thread_count(threads)};
  active->rope(args);
}

std::vector<float> attention_workspace;

/// Grows attention_workspace to what tree_attention needs for these sizes on `count` threads.
void reserve_attention_workspace(int64_t batch, int64_t queries, int64_t q_heads,
                                 int64_t kv_heads, int64_t head_dim, int64_t max_len,
                                 int64_t tree_keys, int count) {
  const int64_t floats = cpu::attention_workspace_total(batch, queries, q_heads, kv_heads,
                                                        head_dim, max_len, tree_keys, count);
  if (attention_workspace.size() < static_cast<size_t>(floats)) attention_workspace.resize(floats);
}

void tree_attention(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t lens,
                    std::uintptr_t tree_mask, std::uintptr_t out, int64_t batch, int64_t queries,
                    int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t max_len,
                    int64_t tree_keys, int64_t words, float scale, int threads) {
  if (kv_heads < 1 || q_heads < 0 || q_heads % kv_heads != 0 || tree_keys < 0 ||
      tree_keys > max_len)
    throw std::invalid_argument("tree_attention: expected kv_heads >= 1 dividing q_heads and "
                                "0 <= tree_keys <= max_len");
  const int count = thread_count(threads);
  reserve_attention_workspace(batch, queries, q_heads, kv_heads, head_dim, max_len, tree_keys,
                              count);
  cpu::AttentionArgs args{as_ptr<const float>(q), as_ptr<const float>(k), as_ptr<const float>(v),
                          as_ptr<const int32_t>(lens), as_ptr<const int32_t>(tree_mask),
                          as_ptr<float>(out), batch, queries, q_heads, kv_heads, head_dim,
                          max_len, tree_keys, words, scale, attention_workspace.data(), count};
  active->tree_attention(args);
}

std::vector<float> layer_workspace;
constexpr size_t kLayerPointers = 26, kLayerSizes = 12, kStackLayerPointers = 18;

/// One decoder layer (kernels.h DecoderLayerArgs). `pointers` in this order: x, residual, out,
/// input_norm (0: none), post_norm, wq, wk, wv, wo, wg, wu, wd (packs, see packed_weight in
/// kernels.h), bq, bk, bv, bo, bg, bu, bd
/// (0: no bias), positions, cos, sin, k_cache, v_cache, lens, tree_mask. `sizes`: batch,
/// count, in_features, hidden, intermediate, q_heads, kv_heads, head_dim, table_rows, max_len,
/// tree_offset, words.
void run_decoder_layer(const std::uintptr_t* p, const std::vector<int64_t>& n, float eps,
                       float scale, int count, const cpu::GemmAhead* next_qkv = nullptr) {
  if (n[6] < 1 || n[5] % n[6] != 0 || n[10] < 0 || n[10] + n[1] > n[9])
    throw std::invalid_argument("decoder_layer: expected kv_heads >= 1 dividing q_heads and "
                                "tree_offset + count <= max_len");
  const int64_t rows = n[0] * n[1];
  const int64_t floats = cpu::decoder_layer_workspace_floats(rows, n[2], n[3], n[5] * n[7],
                                                             n[6] * n[7], n[4]);
  if (layer_workspace.size() < static_cast<size_t>(floats)) layer_workspace.resize(floats);
  reserve_attention_workspace(n[0], n[1], n[5], n[6], n[7], n[9], n[10] + n[1], count);
  cpu::DecoderLayerArgs args{
      as_ptr<const float>(p[0]), as_ptr<const float>(p[1]), as_ptr<float>(p[2]),
      n[0], n[1], n[2], n[3], n[4],
      as_ptr<const float>(p[3]), as_ptr<const float>(p[4]),
      cpu::packed_weight(p[5]), cpu::packed_weight(p[6]), cpu::packed_weight(p[7]),
      cpu::packed_weight(p[8]), cpu::packed_weight(p[9]), cpu::packed_weight(p[10]),
      cpu::packed_weight(p[11]),
      as_ptr<const float>(p[12]), as_ptr<const float>(p[13]), as_ptr<const float>(p[14]),
      as_ptr<const float>(p[15]), as_ptr<const float>(p[16]), as_ptr<const float>(p[17]),
      as_ptr<const float>(p[18]),
      n[5], n[6], n[7], eps, scale,
      as_ptr<const int64_t>(p[19]), as_ptr<const float>(p[20]), as_ptr<const float>(p[21]), n[8],
      as_ptr<float>(p[22]), as_ptr<float>(p[23]), as_ptr<const int32_t>(p[24]), n[9], n[10],
      as_ptr<const int32_t>(p[25]), n[11],
      layer_workspace.data(), attention_workspace.data(),
      linear_workspace(count, std::max({n[2], n[3], n[4], n[5] * n[7]}), rows), count,
      next_qkv};
  active->decoder_layer(args);
}

void decoder_layer(const std::vector<std::uintptr_t>& p, const std::vector<int64_t>& n, float eps,
                   float scale, int threads) {
  if (p.size() != kLayerPointers || n.size() != kLayerSizes)
    throw std::invalid_argument("decoder_layer: expected 26 pointers and 12 sizes");
  run_decoder_layer(p.data(), n, eps, scale, thread_count(threads));
}

std::vector<float> stack_buffers;

/// Consecutive decoder layers of one model in one call (no Python between layers: each
/// return to Python after a layer that streamed megabytes of weights finds its own data
/// evicted from the caches). Every layer takes its input as its residual, so in == hidden.
/// `layers`: per layer input_norm, post_norm, wq, wk, wv, wo, wg, wu, wd, bq, bk, bv, bo, bg,
/// bu, bd, k_cache, v_cache (kStackLayerPointers each). `shared`: x, out, positions, cos, sin,
/// lens, tree_mask. `sizes`: as decoder_layer's. Layer i's output feeds layer i + 1 through
/// two scratch buffers; the last writes `out`. `feature_slots` (empty, or one per layer): layer
/// i's input is copied into columns [slot * hidden, (slot + 1) * hidden) of `features`
/// [rows, slots * hidden] where slot = feature_slots[i] >= 0 (EAGLE-3's captured layers).
/// `final_norm` (0: none): the RMSNorm weight [hidden] applied to `out` in place, with
/// `final_eps`.
void decoder_stack(const std::vector<std::uintptr_t>& layers,
                   const std::vector<std::uintptr_t>& shared, const std::vector<int64_t>& n,
                   float eps, float scale, int threads, std::uintptr_t features,
                   const std::vector<int64_t>& feature_slots, int64_t slots,
                   std::uintptr_t final_norm, float final_eps) {
  if (layers.empty() || layers.size() % kStackLayerPointers != 0 || shared.size() != 7 ||
      n.size() != kLayerSizes || n[2] != n[3])
    throw std::invalid_argument("decoder_stack: expected 18 pointers per layer, 7 shared "
                                "pointers and 12 sizes with in_features == hidden");
  const size_t depth = layers.size() / kStackLayerPointers;
  const int64_t rows = n[0] * n[1], hidden = n[3], width = rows * hidden;
  if (!feature_slots.empty() && (feature_slots.size() != depth || (features == 0 && rows > 0)))
    throw std::invalid_argument("feature_slots: expected none or one per layer, with features");
  for (int64_t slot : feature_slots)
    if (slot >= slots) throw std::invalid_argument("feature_slots: expected slots < slots");
  const int count = thread_count(threads);
  if (stack_buffers.size() < static_cast<size_t>(2 * width)) stack_buffers.resize(2 * width);
  std::uintptr_t p[kLayerPointers];
  std::uintptr_t input = shared[0];
  for (size_t i = 0; i < depth; ++i) {
    if (!feature_slots.empty() && feature_slots[i] >= 0) {
      const float* from = as_ptr<const float>(input);
      float* to = as_ptr<float>(features) + feature_slots[i] * hidden;
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(to + r * slots * hidden, from + r * hidden, hidden * sizeof(float));
    }
    const std::uintptr_t* own = layers.data() + i * kStackLayerPointers;
    const std::uintptr_t output = i + 1 == depth ? shared[1]
        : reinterpret_cast<std::uintptr_t>(stack_buffers.data() + (i % 2) * width);
    p[0] = input;
    p[1] = input;
    p[2] = output;
    for (int j = 0; j < 16; ++j) p[3 + j] = own[j];  // norms, weights, biases
    p[19] = shared[2];
    p[20] = shared[3];
    p[21] = shared[4];
    p[22] = own[16];
    p[23] = own[17];
    p[24] = shared[5];
    p[25] = shared[6];
    cpu::GemmAhead next_qkv{};  // the next layer's q/k/v weights (see GemmAhead)
    const cpu::GemmAhead* ahead = nullptr;
    if (i + 1 < depth) {
      const std::uintptr_t* next = own + kStackLayerPointers;
      next_qkv = {{cpu::packed_weight(next[2]), cpu::packed_weight(next[3]),
                   cpu::packed_weight(next[4])},
                  {n[5] * n[7], n[6] * n[7], n[6] * n[7]}, 3, n[2]};
      ahead = &next_qkv;
    }
    run_decoder_layer(p, n, eps, scale, count, ahead);
    input = output;
  }
  if (final_norm != 0) {  // in place: each row's sum of squares is read before it is written
    float* out = as_ptr<float>(shared[1]);
    active->rms_norm(cpu::RmsNormArgs{out, nullptr, nullptr, as_ptr<const float>(final_norm),
                                      out, rows, hidden, hidden, hidden, final_eps, count});
  }
}

void topk_log_softmax(std::uintptr_t logits, std::uintptr_t d2t, std::uintptr_t values,
                      std::uintptr_t ids, int64_t rows, int64_t vocab, int64_t k, int threads) {
  if (k < 1 || k > vocab || k > cpu::kSelectMaxK)
    throw std::invalid_argument("k: expected 1 <= k <= min(vocab, SELECT_MAX_K)");
  cpu::TopkArgs args{as_ptr<const float>(logits), as_ptr<const int64_t>(d2t),
                     as_ptr<float>(values), as_ptr<int64_t>(ids), rows, vocab, k,
                     thread_count(threads)};
  active->topk_log_softmax(args);
}

void eagle2_expand(std::uintptr_t frontier_scores, std::uintptr_t child_log_probs,
                   std::uintptr_t candidate_scores, std::uintptr_t next_index,
                   std::uintptr_t next_scores, int64_t batch, int64_t frontier,
                   int64_t children, int64_t top_k, int threads) {
  if (top_k < 1 || top_k > frontier * children || top_k > cpu::kSelectMaxK)
    throw std::invalid_argument("top_k: expected 1 <= top_k <= min(K * C, SELECT_MAX_K)");
  cpu::ExpandArgs args{as_ptr<const float>(frontier_scores), as_ptr<const float>(child_log_probs),
                       as_ptr<float>(candidate_scores), as_ptr<int64_t>(next_index),
                       as_ptr<float>(next_scores), batch, frontier, children, top_k,
                       thread_count(threads)};
  active->eagle2_expand(args);
}

std::vector<uint8_t> tree_workspace;

uint8_t* tree_workspace_for(int64_t batch, int64_t nodes) {
  const size_t bytes = static_cast<size_t>(batch * nodes);
  if (tree_workspace.size() < bytes) tree_workspace.resize(bytes);
  return tree_workspace.data();
}

void check_tree_sizes(int64_t batch, int64_t nodes, int64_t max_depth) {
  if (batch < 0 || nodes < 1 || max_depth < 0)
    throw std::invalid_argument("build_tree: expected batch >= 0, nodes >= 1, max_depth >= 0");
}

void build_tree(std::uintptr_t parents, std::uintptr_t depth, std::uintptr_t tree_mask,
                std::uintptr_t paths, int64_t batch, int64_t nodes, int64_t max_depth,
                int threads) {
  check_tree_sizes(batch, nodes, max_depth);
  cpu::BuildTreeArgs args{as_ptr<const int32_t>(parents), as_ptr<int32_t>(depth),
                          as_ptr<int32_t>(tree_mask), as_ptr<int32_t>(paths),
                          tree_workspace_for(batch, nodes), batch, nodes, (nodes + 31) / 32,
                          max_depth + 1, thread_count(threads)};
  active->build_tree(args);
}

/// `outputs`: tokens, parents, depth, scores, tree_mask, paths, selected (a DraftTree's fields
/// in order, then selected).
void eagle2_rerank(std::uintptr_t root_tokens, std::uintptr_t cand_tokens,
                   std::uintptr_t cand_scores, std::uintptr_t cand_parents,
                   const std::vector<std::uintptr_t>& outputs, int64_t batch,
                   int64_t candidates, int64_t nodes, int64_t max_depth, int threads) {
  check_tree_sizes(batch, nodes, max_depth);
  if (outputs.size() != 7) throw std::invalid_argument("outputs: expected 7 pointers");
  if (nodes > candidates + 1 || nodes - 1 > cpu::kSelectMaxK)
    throw std::invalid_argument(
        "eagle2_rerank: expected nodes <= min(candidates, SELECT_MAX_K) + 1");
  cpu::RerankArgs args{as_ptr<const int64_t>(root_tokens), as_ptr<const int64_t>(cand_tokens),
                       as_ptr<const float>(cand_scores), as_ptr<const int32_t>(cand_parents),
                       as_ptr<int64_t>(outputs[0]), as_ptr<int32_t>(outputs[1]),
                       as_ptr<int32_t>(outputs[2]), as_ptr<float>(outputs[3]),
                       as_ptr<int32_t>(outputs[4]), as_ptr<int32_t>(outputs[5]),
                       as_ptr<int64_t>(outputs[6]), tree_workspace_for(batch, nodes), batch,
                       candidates, nodes, (nodes + 31) / 32, max_depth + 1,
                       thread_count(threads)};
  active->eagle2_rerank(args);
}

/// `outputs`: output_tokens, num_accepted, accepted_nodes (an AcceptResult's fields).
void greedy_accept(std::uintptr_t logits, std::uintptr_t tokens, std::uintptr_t paths,
                   std::uintptr_t target_ids, const std::vector<std::uintptr_t>& outputs,
                   int64_t batch, int64_t nodes, int64_t vocab, int64_t num_paths,
                   int64_t width, int threads) {
  if (outputs.size() != 3) throw std::invalid_argument("outputs: expected 3 pointers");
  if (batch < 0 || nodes < 1 || vocab < 1 || num_paths < 1 || width < 1)
    throw std::invalid_argument("greedy_accept: expected batch >= 0 and positive sizes");
  cpu::GreedyAcceptArgs args{as_ptr<const float>(logits), as_ptr<const int64_t>(tokens),
                             as_ptr<const int32_t>(paths), as_ptr<int64_t>(target_ids),
                             as_ptr<int64_t>(outputs[0]), as_ptr<int32_t>(outputs[1]),
                             as_ptr<int32_t>(outputs[2]), batch, nodes, vocab, num_paths,
                             width, thread_count(threads)};
  active->greedy_accept(args);
}

void compact_kv(const std::vector<std::uintptr_t>& caches, const std::vector<int64_t>& row_bytes,
                std::uintptr_t lens, std::uintptr_t nodes, std::uintptr_t num_accepted,
                int64_t batch, int64_t max_len, int64_t width) {
  if (caches.size() != row_bytes.size())
    throw std::invalid_argument("row_bytes: expected one per cache");
  for (int64_t bytes : row_bytes)
    if (bytes < 1) throw std::invalid_argument("row_bytes: expected positive sizes");
  if (batch < 0 || max_len < 0 || width < 1)
    throw std::invalid_argument("compact_kv: expected batch >= 0, max_len >= 0, width >= 1");
  cpu::CompactKvArgs args{caches.data(), row_bytes.data(), static_cast<int64_t>(caches.size()),
                          as_ptr<const int32_t>(lens), as_ptr<const int32_t>(nodes),
                          as_ptr<const int32_t>(num_accepted), batch, max_len, width};
  active->compact_kv(args);
}

/// `state`: the call's generated [B] int64, done [B] bool, out [B, out_width] int64, budgets
/// [B] int64 and eos [num_eos] int64 (eagle_kernels/runtime/generation.py _Call).
cpu::RecordArgs record_args(const std::vector<std::uintptr_t>& state, int64_t batch,
                            int64_t out_width, int64_t num_eos) {
  if (state.size() != 5) throw std::invalid_argument("state: expected 5 pointers");
  if (batch < 0 || out_width < 0 || num_eos < 0)
    throw std::invalid_argument("record: expected batch, out_width, num_eos >= 0");
  return {nullptr, nullptr, as_ptr<const int64_t>(state[4]), as_ptr<const int64_t>(state[3]),
          as_ptr<int64_t>(state[0]), as_ptr<bool>(state[1]), as_ptr<int64_t>(state[2]),
          nullptr, batch, 1, num_eos, out_width};
}

void record_tokens(std::uintptr_t new_tokens, std::uintptr_t counts, std::uintptr_t recorded,
                   const std::vector<std::uintptr_t>& state, int64_t batch, int64_t width,
                   int64_t out_width, int64_t num_eos) {
  if (width < 1) throw std::invalid_argument("record_tokens: expected width >= 1");
  cpu::RecordArgs args = record_args(state, batch, out_width, num_eos);
  args.new_tokens = as_ptr<const int64_t>(new_tokens);
  args.counts = as_ptr<const int64_t>(counts);
  args.recorded = as_ptr<int64_t>(recorded);
  args.width = width;
  active->record_tokens(args);
}

void greedy_step(std::uintptr_t logits, std::uintptr_t lens, std::uintptr_t root,
                 std::uintptr_t active_rows, std::uintptr_t recorded,
                 const std::vector<std::uintptr_t>& state, int64_t batch, int64_t vocab,
                 int64_t out_width, int64_t num_eos) {
  if (vocab < 1) throw std::invalid_argument("greedy_step: expected vocab >= 1");
  cpu::GreedyStepArgs args{as_ptr<const float>(logits), as_ptr<int32_t>(lens),
                           as_ptr<int64_t>(root), as_ptr<int64_t>(active_rows), vocab,
                           record_args(state, batch, out_width, num_eos)};
  args.record.new_tokens = args.root;
  args.record.recorded = as_ptr<int64_t>(recorded);
  active->greedy_step(args);
}

cpu::SoftCrossEntropyArgs soft_ce_args(std::uintptr_t x, std::uintptr_t y, std::uintptr_t stats,
                                       int64_t rows, int64_t vocab, int threads) {
  return {as_ptr<const float>(x), as_ptr<const float>(y), nullptr, as_ptr<float>(stats),
          nullptr, nullptr, rows, vocab, thread_count(threads)};
}

void soft_ce_forward(std::uintptr_t x, std::uintptr_t y, std::uintptr_t loss, std::uintptr_t stats,
                     int64_t rows, int64_t vocab, int threads) {
  cpu::SoftCrossEntropyArgs args = soft_ce_args(x, y, stats, rows, vocab, threads);
  args.loss = as_ptr<float>(loss);
  active->soft_ce_forward(args);
}

void soft_ce_backward(std::uintptr_t x, std::uintptr_t y, std::uintptr_t stats,
                      std::uintptr_t grad_loss, std::uintptr_t grad_x, int64_t rows,
                      int64_t vocab, int threads) {
  cpu::SoftCrossEntropyArgs args = soft_ce_args(x, y, stats, rows, vocab, threads);
  args.grad_loss = as_ptr<const float>(grad_loss);
  args.grad_x = as_ptr<float>(grad_x);
  active->soft_ce_backward(args);
}

}  // namespace

PYBIND11_MODULE(_cpu, module) {
  module.doc() = "eagle_kernels CPU kernels (fp32, OpenMP, AVX-512 / AVX2 / generic at run time)";
  select_default_isa();
  module.attr("SELECT_MAX_K") = cpu::kSelectMaxK;
  module.attr("Q4_ZERO_LEVEL") = cpu::kQ4ZeroLevel;
  cpu::cpu_modes.vnni = supports("avx512") && __builtin_cpu_supports("avx512vnni") &&
                        __builtin_cpu_supports("avx512vbmi");
  module.def(
      "set_activation_bits",
      [](int bits) {
        if (bits != 0 && bits != 8 && bits != 16)
          throw std::invalid_argument("bits: expected 0 (fp32), 8 or 16, got " +
                                      std::to_string(bits));
        cpu::cpu_modes.activation_bits = bits;
      },
      py::arg("bits"),
      "GEMMs over Q4 / Q8 packs round x to int8 / int16 per block of 32 k first "
      "(csrc/cpu/linear_int8.h); 0: fp32 activations.");
  module.def("activation_bits", [] { return cpu::cpu_modes.activation_bits; });
  module.def("int8_vnni", [] { return cpu::cpu_modes.vnni; },
             "Whether the AVX-512 kernels' int8 GEMM uses VNNI + VBMI on this processor.");
  module.def("isa", [] { return std::string(active->isa); },
             "The instruction set the kernels run with.");
  module.def("supported_isas", &supported_isas,
             "Instruction sets this processor supports, best first.");
  module.def("set_isa", &select_isa, py::arg("isa"),
             "Run the kernels with another supported instruction set (tests compare them).");
  module.def("linear", &linear, py::arg("x"), py::arg("m"), py::arg("k"), py::arg("ldx"),
             py::arg("segments"), py::arg("threads") = 0,
             "y = x @ w^T (+ bias) for each segment (w, bias or 0, y, n, ldy), fp32.");
  module.def("rms_norm", &rms_norm, py::arg("x"), py::arg("residual"), py::arg("sum_out"),
             py::arg("weight"), py::arg("y"), py::arg("rows"), py::arg("n"), py::arg("ldx"),
             py::arg("ldy"), py::arg("eps"), py::arg("threads") = 0);
  module.def("silu_mul", &silu_mul, py::arg("gate"), py::arg("up"), py::arg("y"),
             py::arg("rows"), py::arg("n"), py::arg("ld_in"), py::arg("ld_out"),
             py::arg("threads") = 0);
  module.def("rope", &rope, py::arg("x"), py::arg("positions"), py::arg("cos"), py::arg("sin"),
             py::arg("rows"), py::arg("heads"), py::arg("head_dim"), py::arg("ldx"),
             py::arg("table_rows"), py::arg("threads") = 0);
  module.def("tree_attention", &tree_attention, py::arg("q"), py::arg("k_cache"),
             py::arg("v_cache"), py::arg("cache_lens"), py::arg("tree_mask"), py::arg("out"),
             py::arg("batch"), py::arg("queries"), py::arg("q_heads"), py::arg("kv_heads"),
             py::arg("head_dim"), py::arg("max_len"), py::arg("tree_keys"), py::arg("words"),
             py::arg("scale"), py::arg("threads") = 0);
  module.def("decoder_layer", &decoder_layer, py::arg("pointers"), py::arg("sizes"),
             py::arg("eps"), py::arg("scale"), py::arg("threads") = 0,
             "One decoder layer over the cache (see csrc/cpu/kernels.h DecoderLayerArgs).");
  module.def("decoder_stack", &decoder_stack, py::arg("layers"), py::arg("shared"),
             py::arg("sizes"), py::arg("eps"), py::arg("scale"), py::arg("threads") = 0,
             py::arg("features") = 0, py::arg("feature_slots") = std::vector<int64_t>(),
             py::arg("slots") = 0, py::arg("final_norm") = 0, py::arg("final_eps") = 0.0f,
             "Consecutive decoder layers in one call (see decoder_stack in cpu_bindings.cpp).");
  module.def("compact_kv", &compact_kv, py::arg("caches"), py::arg("row_bytes"),
             py::arg("lens"), py::arg("nodes"), py::arg("num_accepted"), py::arg("batch"),
             py::arg("max_len"), py::arg("width"),
             "The accepted path's K/V rows next to the prefix, in place (csrc/cpu/kv.h).");
  module.def("soft_ce_forward", &soft_ce_forward, py::arg("x"), py::arg("y"), py::arg("loss"),
             py::arg("stats"), py::arg("rows"), py::arg("vocab"), py::arg("threads") = 0,
             "soft_cross_entropy forward (csrc/cpu/loss.h): loss [rows], stats [4, rows].");
  module.def("soft_ce_backward", &soft_ce_backward, py::arg("x"), py::arg("y"), py::arg("stats"),
             py::arg("grad_loss"), py::arg("grad_x"), py::arg("rows"), py::arg("vocab"),
             py::arg("threads") = 0, "soft_cross_entropy backward (csrc/cpu/loss.h).");
  module.def("topk_log_softmax", &topk_log_softmax, py::arg("logits"), py::arg("d2t"),
             py::arg("values"), py::arg("ids"), py::arg("rows"), py::arg("vocab"), py::arg("k"),
             py::arg("threads") = 0, "Fused log-softmax + top-k (csrc/cpu/topk.h).");
  module.def("eagle2_expand", &eagle2_expand, py::arg("frontier_scores"),
             py::arg("child_log_probs"), py::arg("candidate_scores"), py::arg("next_index"),
             py::arg("next_scores"), py::arg("batch"), py::arg("frontier"), py::arg("children"),
             py::arg("top_k"), py::arg("threads") = 0,
             "One EAGLE-2 expansion step (csrc/cpu/topk.h).");
  module.def("build_tree", &build_tree, py::arg("parents"), py::arg("depth"),
             py::arg("tree_mask"), py::arg("paths"), py::arg("batch"), py::arg("nodes"),
             py::arg("max_depth"), py::arg("threads") = 0,
             "Depth, packed ancestor mask and paths (csrc/cpu/tree.h).");
  module.def("eagle2_rerank", &eagle2_rerank, py::arg("root_tokens"), py::arg("cand_tokens"),
             py::arg("cand_scores"), py::arg("cand_parents"), py::arg("outputs"),
             py::arg("batch"), py::arg("candidates"), py::arg("nodes"), py::arg("max_depth"),
             py::arg("threads") = 0, "Best N - 1 candidates -> a draft tree (csrc/cpu/tree.h).");
  module.def("greedy_accept", &greedy_accept, py::arg("logits"), py::arg("tokens"),
             py::arg("paths"), py::arg("target_ids"), py::arg("outputs"), py::arg("batch"),
             py::arg("nodes"), py::arg("vocab"), py::arg("num_paths"), py::arg("width"),
             py::arg("threads") = 0, "Greedy tree / chain acceptance (csrc/cpu/acceptance.h).");
  module.def("record_tokens", &record_tokens, py::arg("new_tokens"), py::arg("counts"),
             py::arg("recorded"), py::arg("state"), py::arg("batch"), py::arg("width"),
             py::arg("out_width"), py::arg("num_eos"),
             "The decode loop's token bookkeeping (csrc/cpu/acceptance.h).");
  module.def("greedy_step", &greedy_step, py::arg("logits"), py::arg("lens"), py::arg("root"),
             py::arg("active"), py::arg("recorded"), py::arg("state"), py::arg("batch"),
             py::arg("vocab"), py::arg("out_width"), py::arg("num_eos"),
             "Greedy step: argmax, cache lengths, bookkeeping (csrc/cpu/acceptance.h).");
}
