/**
 * @file kernels.h
 * @brief The CPU kernels' entry points (one set per instruction set) and their argument structs.
 *
 * Torch-free: the Python launchers in eagle_kernels/ops/ pass raw pointers and sizes (the
 * contract of each op, shapes and dtypes, is in its Python docstring; inputs are validated
 * there). All tensors are fp32 and row-major.
 *
 * Row invariance. Each output row of every kernel here is computed by code that does not depend
 * on how many rows are computed with it, nor on the thread count: GEMM columns are split across
 * threads, never the reduction; each GEMM output adds fixed chunks (a block pack: blocks) of k
 * in order, each one sequential FMA chain (decoder_linear.h); attention reduces over a query's
 * visible keys in position order (prefix, then tree ancestors by index), its value sums in
 * fixed blocks of positions
 * (kAttentionValueBlock), whatever the other queries are. So a token's logits in a verify
 * pass over N tree nodes equal, bit for bit, its logits in a one-token decode step over the
 * same prefix.
 */
#pragma once

#include <cstdint>
#include <type_traits>

namespace eagle_kernels {
namespace cpu {

/// A weight packed for the GEMM: [ceil(n / 16), k, 16], panel p holding w[16p : 16p + 16, :]^T
/// (zero-padded), see decoder_linear.h. Its elements are fp32; or bf16 when every weight is exactly a
/// bf16 value (widened exactly: the fp32 pack's results bit for bit); or 4-bit blocks when every
/// weight is exactly fl(d * q + m) of a GGUF Q4_1 block (32 consecutive k, fp16 d and m, q in
/// 0..15, m + kQ4ZeroLevel d exact in fp32; decoder_linear.h kQ4BlockBytes); or 8-bit blocks when every
/// weight is exactly d * q of a GGUF Q8_0 block (fp16 d, q in -128..127; kQ8BlockBytes).
/// A block pack's GEMM sums each block in its integer levels and scales the block's sum once
/// (decoder_linear.h "block packs"): the same weights, but not the fp32 pack's rounding.
enum class PackFormat : unsigned { kF32 = 0, kBf16 = 1, kQ4 = 2, kQ8 = 3 };

/// k per Q4_1 / Q8_0 block (GGUF's, and the block packs' unit of scaling).
constexpr int64_t kQ4BlockK = 32;
/// The level a Q4 block's GEMM multiplies x by is q - kQ4ZeroLevel (-8..7: centred, so a block's
/// level sum and its offset term do not cancel each other's digits away); the pack's offset is
/// o = m + kQ4ZeroLevel d, so d (q - 8) + o = d q + m. Exported as _cpu.Q4_ZERO_LEVEL, which the
/// tests compare with the Python packer's copy (ops/decoder.py Q4_ZERO_LEVEL).
constexpr int kQ4ZeroLevel = 8;

struct PackedWeight {
  const void* data;
  PackFormat format;
};

/// Python hands a packed weight over as one integer: its address, with its low two bits holding
/// the PackFormat (packs are 64-byte aligned, so those bits are otherwise 0).
static inline PackedWeight packed_weight(std::uintptr_t tagged) {
  return PackedWeight{reinterpret_cast<const void*>(tagged & ~std::uintptr_t{3}),
                      static_cast<PackFormat>(static_cast<unsigned>(tagged & 3u))};
}

/// One weight matrix of a (fused) linear layer: y[:, :n] = x @ w^T (+ bias).
struct LinearSegment {
  PackedWeight w;
  const float* bias;  ///< [n] or nullptr
  float* y;           ///< [m, n] with row stride ldy
  int64_t n;
  int64_t ldy;
};

/// Cache lines a thread asks for ahead of use: `lines` 64-byte lines from `from`.
struct LineRange {
  const char* from;
  int64_t lines;
};

/// What runs after a GEMM, for the GEMM to ask for during each thread's last tile (or block, or
/// panel): the first lines thread `thread` of `threads` reads there (the next GEMM's first
/// tile, the attention's first key block), as `first(what, thread, threads)`. Never changes
/// what is computed.
struct LookAhead {
  LineRange (*first)(const void* what, int64_t thread, int64_t threads);
  const void* what;
};

/// The weights of a GEMM (its segments' packs and widths, over k): what a LookAhead of the
/// GEMM before it points at (decoder_linear.h gemm_first_tile).
struct GemmAhead {
  static constexpr int kMaxSegments = 3;
  PackedWeight w[kMaxSegments];
  int64_t n[kMaxSegments];
  int count;
  int64_t k;
};

struct LinearArgs {
  const float* x;  ///< [m, k], row stride ldx
  int64_t m, k, ldx;
  const LinearSegment* segments;
  int num_segments;
  float* widened;  ///< threads * linear_workspace_floats(k, m): see there
  int threads;
  LookAhead then{};  ///< what runs after this GEMM (first: nullptr for nothing)
};

/// Bytes of packed panels a many-row GEMM keeps in L2 while every row tile passes over them
/// (decoder_linear.h linear_panels); at least kBlockMinPanels panels whatever their size. Measured
/// on AVX2 with every row tile prefetching the next block, a SmolLM2 layer stack over 8 rows:
/// 256 KB 21.3 ms, 128 KB 20.6, 96 KB 20.4; 16 rows within noise.
constexpr int64_t kPanelBlockBytes = 96 * 1024;
constexpr int64_t kBlockMinPanels = 4;  ///< >= every instruction set's kPanelTile

/// Floats one thread needs to widen one block of bf16 panels over k to fp32, or of Q4 / Q8
/// panels to fp32 levels with their block scales (decoder_linear.h Levels: at most 17 k floats a panel).
static inline int64_t linear_widen_floats(int64_t k) {
  const int64_t floats = kPanelBlockBytes / 4, smallest = kBlockMinPanels * (k + kQ4BlockK) * 17;
  return floats > smallest ? floats : smallest;
}

/// Where a thread's int8 copy of the rows starts in its GEMM workspace (in floats): after the
/// widened panels and the block sums of the m rows of x over k (Q4 packs' offsets,
/// decoder_linear.h block_sums), rounded up to 16.
static inline int64_t linear_int8_offset_floats(int64_t k, int64_t m) {
  return linear_widen_floats(k) + (m * (k / kQ4BlockK) + 15) / 16 * 16;
}

/// Floats one thread's part of a GEMM workspace holds: widened panels, block sums, then the
/// rows quantized (linear_int8.h QuantizedRows: four [m, k] byte arrays, and per block a scale
/// and two sums), rounded up to 16.
static inline int64_t linear_workspace_floats(int64_t k, int64_t m) {
  const int64_t quantized = (4 * m * k + 3) / 4 + 3 * m * (k / kQ4BlockK);
  return linear_int8_offset_floats(k, m) + (quantized + 15) / 16 * 16;
}

/// Process-wide modes of the CPU kernels (set by cpu_bindings.cpp; the GIL serialises calls).
struct CpuModes {
  /// 0: fp32 activations (the fp32 contract); 8 / 16: GEMMs over Q4 / Q8 packs round x to
  /// int8 / int16 per block of 32 k first (linear_int8.h; the opt-in fast paths,
  /// eagle_kernels.ops.set_cpu_activations).
  int activation_bits = 0;
  /// This processor has AVX-512 VNNI and VBMI: the AVX-512 kernels' int8 GEMM uses them.
  bool vnni = false;
};
inline CpuModes cpu_modes;

struct RmsNormArgs {
  const float* x;         ///< [rows, n], row stride ldx
  const float* residual;  ///< optional [rows, n] (row stride ldx): x + residual is normalised
  float* sum_out;         ///< where x + residual is written when residual is given ([rows, n], ldy)
  const float* weight;    ///< [n]
  float* y;               ///< [rows, n], row stride ldy
  int64_t rows, n, ldx, ldy;
  float eps;
  int threads;
};

struct SiluMulArgs {
  const float* gate;  ///< [rows, n], row stride ld_in
  const float* up;    ///< [rows, n], row stride ld_in
  float* y;           ///< [rows, n], row stride ld_out
  int64_t rows, n, ld_in, ld_out;
  int threads;
};

struct RopeArgs {
  float* x;                  ///< [rows, heads, head_dim] rotated in place, row stride ldx
  const int64_t* positions;  ///< [rows], clamped into [0, table_rows)
  const float* cos;          ///< [table_rows, head_dim] (both halves, as transformers builds it)
  const float* sin;
  int64_t rows, heads, head_dim, ldx, table_rows;
  int threads;
};

struct AttentionArgs {
  const float* q;          ///< [B, Nq, Hq, D]
  const float* k_cache;    ///< [B, max_len, Hkv, D]
  const float* v_cache;    ///< [B, max_len, Hkv, D]
  const int32_t* lens;     ///< [B] prefix lengths (clamped into [0, max_len - tree_keys])
  const int32_t* tree_mask;  ///< [B, Nq, words] packed ancestor bits over the tree keys
  float* out;              ///< [B, Nq, Hq, D]
  int64_t batch, queries, q_heads, kv_heads, head_dim, max_len, tree_keys, words;
  float scale;
  float* workspace;        ///< attention_workspace_total(...) floats
  int threads;
};

/// soft_cross_entropy (loss.h): forward fills loss and stats; backward fills grad_x from
/// stats and grad_loss. x, y, grad_x are [rows, vocab] contiguous.
struct SoftCrossEntropyArgs {
  const float* x;          ///< draft logits (-inf allowed)
  const float* y;          ///< target logits (-inf allowed, one finite entry per row)
  float* loss;             ///< [rows] (forward)
  float* stats;            ///< [4, rows]: max x, log sum e^(x - max), the same for y
  const float* grad_loss;  ///< [rows] (backward)
  float* grad_x;           ///< [rows, vocab] (backward)
  int64_t rows, vocab;
  int threads;
};

/// Running maxima start here (finite), so x - max is never -inf - -inf (the Triton kernel's
/// NEG_BIG): a row of x that is all -inf gets sx = 0 and loss -inf - ..., never NaN from it.
constexpr float kLossMaxFloor = -1.0e30f;
/// Vocabulary entries per partial sum in loss.h (a multiple of every ISA's lane count).
constexpr int64_t kLossBlock = 256;

/// topk_log_softmax (topk.h): the k best of each vocabulary row, their log-softmax and ids.
struct TopkArgs {
  const float* logits;  ///< [rows, vocab] contiguous (-inf allowed)
  const int64_t* d2t;   ///< [vocab] draft -> target id offsets, or nullptr
  float* values;        ///< [rows, k] log-probs, best first
  int64_t* ids;         ///< [rows, k] (target) ids
  int64_t rows, vocab, k;
  int threads;
};

/// eagle2_expand (topk.h): candidate scores of a frontier's children and the next frontier.
struct ExpandArgs {
  const float* frontier_scores;  ///< [batch, frontier]
  const float* child_log_probs;  ///< [batch, frontier, children]
  float* candidate_scores;       ///< [batch, frontier * children]
  int64_t* next_index;           ///< [batch, top_k]
  float* next_scores;            ///< [batch, top_k]
  int64_t batch, frontier, children, top_k;
  int threads;
};

/// build_tree (tree.h): depth, packed ancestor mask and paths of B trees of N nodes.
struct BuildTreeArgs {
  const int32_t* parents;  ///< [batch, nodes], topologically ordered (-1 for the root)
  int32_t* depth;          ///< [batch, nodes]
  int32_t* tree_mask;      ///< [batch, nodes, words]
  int32_t* paths;          ///< [batch, nodes, width], width = max_depth + 1
  uint8_t* workspace;      ///< [batch, nodes]
  int64_t batch, nodes, words, width;
  int threads;
};

/// eagle2_rerank (tree.h): the best N - 1 of M drafted candidates as a tree, built in place.
struct RerankArgs {
  const int64_t* root_tokens;  ///< [batch]
  const int64_t* cand_tokens;  ///< [batch, candidates]
  const float* cand_scores;    ///< [batch, candidates]
  const int32_t* cand_parents;  ///< [batch, candidates], -1: child of the root
  int64_t* tokens;             ///< [batch, nodes]
  int32_t* parents;            ///< [batch, nodes]
  int32_t* depth;              ///< [batch, nodes]
  float* scores;               ///< [batch, nodes]
  int32_t* tree_mask;          ///< [batch, nodes, words]
  int32_t* paths;              ///< [batch, nodes, width]
  int64_t* selected;           ///< [batch, nodes - 1]
  uint8_t* workspace;          ///< [batch, nodes]
  int64_t batch, candidates, nodes, words, width;
  int threads;
};

/// greedy_accept_tree / _chain (acceptance.h): argmax of every node's logits, then the first
/// longest path the target agrees with.
struct GreedyAcceptArgs {
  const float* logits;      ///< [batch, nodes, vocab]
  const int64_t* tokens;    ///< [batch, nodes]
  const int32_t* paths;     ///< [batch, num_paths, width], -1 padded
  int64_t* target_ids;      ///< [batch, nodes] workspace: the argmax of each node
  int64_t* output_tokens;   ///< [batch, width]
  int32_t* num_accepted;    ///< [batch]
  int32_t* accepted_nodes;  ///< [batch, width]
  int64_t batch, nodes, vocab, num_paths, width;
  int threads;
};

/// record_tokens (acceptance.h): the decode loop's bookkeeping (eagle_kernels/runtime/
/// generation.py _Call.record) in one call: row b offers counts[b] of new_tokens[b]; done rows
/// take none, a row stops after its first EOS and at its budget; the taken tokens go to
/// out[b, generated[b]:], then generated and done advance. Every count is clamped into the
/// buffers, so no input reads or writes out of bounds.
struct RecordArgs {
  const int64_t* new_tokens;  ///< [batch, width]
  const int64_t* counts;      ///< [batch] tokens offered (null: one each)
  const int64_t* eos;         ///< [num_eos] stop tokens
  const int64_t* budgets;     ///< [batch] new tokens allowed in all
  int64_t* generated;         ///< [batch] new tokens so far (advanced)
  bool* done;                 ///< [batch] (set on EOS or a spent budget)
  int64_t* out;               ///< [batch, out_width] the call's output buffer
  int64_t* recorded;          ///< [batch] out: tokens taken this time
  int64_t batch, width, num_eos, out_width;
};

/// greedy_step (acceptance.h): the greedy autoregressive step's choice and bookkeeping in one
/// call: root[b] = argmax of logits[b] (greedy_accept_chain's rule), active[b] = !done[b]
/// before the step, lens[b] += active[b], then record_tokens of root with count 1.
struct GreedyStepArgs {
  const float* logits;  ///< [batch, vocab]
  int32_t* lens;        ///< [batch] target cache lengths (advanced for active rows)
  int64_t* root;        ///< [batch] out: the chosen tokens (record.new_tokens points here)
  int64_t* active;      ///< [batch] out: 1 for rows active in this step
  int64_t vocab;
  RecordArgs record;    ///< new_tokens = root, width 1, counts null (one each)
};

/// compact_kv (kv.h): the accepted path's rows of every cache [batch, max_len, row] moved next
/// to the committed prefix.
struct CompactKvArgs {
  const std::uintptr_t* caches;  ///< [num_caches] base addresses
  const int64_t* row_bytes;      ///< [num_caches] bytes of one (sequence, position) row
  int64_t num_caches;
  const int32_t* lens;           ///< [batch] committed lengths
  const int32_t* nodes;          ///< [batch, width] root then accepted node indices, -1 padded
  const int32_t* num_accepted;   ///< [batch]
  int64_t batch, max_len, width;
};

/// The drafting and acceptance kernels (topk.h, tree.h, acceptance.h) run on one thread below
/// this many entries of work (logits, candidates, path cells): a draft step's few small calls
/// would otherwise each pay a parallel region's wake-up, which costs far more than the work
/// whenever another process holds a core.
constexpr int64_t kParallelMinEntries = 1 << 15;
/// Largest k the cpu top-k selection takes (topk.h select_top keeps a sorted array: an insert
/// shifts up to k entries). Exported as _cpu.SELECT_MAX_K; larger k falls through to torch.
constexpr int64_t kSelectMaxK = 1024;
/// Vocabulary entries per partial sum of topk_log_softmax's e^(x - max) (any size works; the
/// two-level sum keeps a 150k row's rounding small).
constexpr int64_t kTopkBlock = 256;

/**
 * One whole decoder layer (pre-norm Llama / Qwen2 / Mistral block, SiLU-gated MLP) over M = B*T
 * rows, in one call: what the runtime runs per layer on CPU, so a decode step costs 30 calls
 * instead of 300 (Python overhead per op is tens of microseconds, a decode step's memory
 * floor 25 ms). It composes the kernels above, so every row stays row-invariant:
 *
 *   a   = input_norm ? rms_norm(x) : x              (x [M, in])
 *   q,k,v = a @ Wq/Wk/Wv^T (+ bias); q, k rotated    (RoPE table lookup at positions)
 *   k, v written to the cache at lens[b] + tree_offset + t (rows past max_len are dropped)
 *   o   = tree_attention(q, cache, mask) @ Wo^T (+ bias)
 *   h   = o + residual                                (residual [M, H]; x when none is given)
 *   out = h + down(silu(gate(norm2(h))) * up(norm2(h)))
 */
struct DecoderLayerArgs {
  const float* x;         ///< [M, in_features]
  const float* residual;  ///< [M, hidden]
  float* out;             ///< [M, hidden]
  int64_t batch, count, in_features, hidden, intermediate;
  const float* input_norm;  ///< [in_features] or nullptr (no input norm)
  const float* post_norm;   ///< [hidden]
  PackedWeight wq, wk, wv, wo, wg, wu, wd;                ///< nn.Linear weights [N, K], packed
  const float *bq, *bk, *bv, *bo, *bg, *bu, *bd;          ///< biases or nullptr
  int64_t q_heads, kv_heads, head_dim;
  float eps, scale;
  const int64_t* positions;  ///< [M]
  const float *cos, *sin;    ///< [table_rows, head_dim]
  int64_t table_rows;
  float *k_cache, *v_cache;  ///< [B, max_len, kv_heads, head_dim]
  const int32_t* lens;       ///< [B]
  int64_t max_len, tree_offset;
  const int32_t* tree_mask;  ///< [B, T, words] over tree_offset + T tree keys
  int64_t words;
  float* workspace;  ///< decoder_layer_workspace_floats(...)
  float* attention_workspace;  ///< attention_workspace_total(...) floats
  float* linear_workspace;     ///< threads * linear_workspace_floats(widest k, rows) of the layer
  int threads;
  const GemmAhead* next_qkv = nullptr;  ///< the next layer's q/k/v GEMM (a stack), or nullptr
};

/// Floats of layer workspace (decoder_layer.h): normed input, q, attention output, k, v, o, h,
/// normed h, down, gate, up.
static inline int64_t decoder_layer_workspace_floats(int64_t rows, int64_t in_features,
                                                     int64_t hidden, int64_t q_width,
                                                     int64_t kv_width, int64_t intermediate) {
  return rows * (in_features + 2 * q_width + 2 * kv_width + 4 * hidden + 2 * intermediate);
}

// Tree attention tasks (attention.h): a task holds up to kAttentionTaskNodes query nodes x the
// query heads of one KV group (<= kAttentionMaxGroup; a larger group goes one head per task),
// and walks the prefix in blocks of kAttentionKeyBlock rows (16 KB of keys at head_dim 64: the
// block stays in L1 while every query of the task uses it).
constexpr int64_t kAttentionTaskNodes = 8;
constexpr int64_t kAttentionMaxGroup = 16;
constexpr int64_t kAttentionKeyBlock = 64;

/// How tree_attention shares out its queries: `node_blocks` blocks of nodes per (sequence,
/// KV head), `heads` query heads per task (the whole group, or 1).
struct AttentionPlan {
  int64_t node_blocks, heads;
};

/// Whole groups per task whenever that still gives every thread two tasks (a decode step's
/// kv_heads tasks would not: it goes one head per task); then the fewest node blocks that give
/// 2 tasks per thread, a multiple of the thread count where the nodes allow, and blocks of at
/// most kAttentionTaskNodes nodes. Changes only who computes a query, never how.
static inline AttentionPlan attention_plan(int64_t batch, int64_t queries, int64_t q_heads,
                                           int64_t kv_heads, int64_t threads) {
  const int64_t group = kv_heads > 0 ? q_heads / kv_heads : 1, groups = batch * kv_heads;
  if (queries < 1 || groups < 1) return {1, 1};
  if (group > kAttentionMaxGroup || groups * queries < 2 * threads)
    return {queries, 1};
  int64_t blocks = (2 * threads + groups - 1) / groups;
  const int64_t fewest = (queries + kAttentionTaskNodes - 1) / kAttentionTaskNodes;
  if (blocks < fewest) blocks = fewest;
  while (blocks < queries && (groups * blocks) % threads != 0) ++blocks;
  return {blocks < queries ? blocks : queries, group};
}

/// Nodes and query heads of a plan's largest task (node blocks split the nodes evenly).
struct AttentionTaskShape {
  int64_t nodes, heads;
};

static inline AttentionTaskShape attention_task_shape(const AttentionPlan& plan,
                                                      int64_t queries) {
  const int64_t blocks = plan.node_blocks > 0 ? plan.node_blocks : 1;
  return {(queries + blocks - 1) / blocks, plan.heads};
}

/// A query's value sums go over its visible list (the prefix, then its tree keys at positions
/// L, L + 1, ...) in blocks of this many positions, aligned at position 0: each block's sum one
/// FMA chain per lane from zero, the block sums added in block order (attention.h). Fixed, so
/// every plan, thread count and row count gives the same bits, and whole prefix blocks can be
/// summed by whichever thread reads their rows (split attention).
constexpr int64_t kAttentionValueBlock = 64;

/// Floats of attention workspace: one query's scores (padded to whole vectors, the softmax
/// pads with -inf), then its value sums (the closed blocks' total, then the open block's
/// chain; head_dim padded each); a thread holds the queries of one task, then each node's
/// visible tree slots (static: every translation unit, each compiled for its own instruction
/// set, keeps a private copy).
static inline int64_t attention_scores_floats(int64_t max_len) { return (max_len + 16) / 16 * 16; }
static inline int64_t attention_row_floats(int64_t head_dim) { return (head_dim + 15) / 16 * 16; }
static inline int64_t attention_query_floats(int64_t max_len, int64_t head_dim) {
  return attention_scores_floats(max_len) + 2 * attention_row_floats(head_dim);
}
static inline int64_t attention_workspace_floats(int64_t max_len, int64_t tree_keys,
                                                 int64_t head_dim, AttentionTaskShape task) {
  return task.nodes * (task.heads * attention_query_floats(max_len, head_dim) + tree_keys) + 16;
}

// Split attention (attention.h tree_attention_split): calls with at most
// kAttentionSplitMaxQueries query nodes per sequence share the keys out instead: each thread
// scores a contiguous run of prefix key blocks for every query head, then sums the values of a
// contiguous run of whole value blocks (kAttentionValueBlock rows, every KV head) for every
// query; the blocks' sums and each query's last part-block and tree keys are added after.
// A decode step had 9 one-head tasks, each walking its KV head's 256-byte rows (768 bytes
// apart) from DRAM at ~8-11 GB/s. Same arithmetic per query (only who computes which score or
// block changes). Measured (SmolLM2 layer stack, one process, alternating): decode -1.5 % at
// context 256, -18 % at 1024, -26 % at 2048; 2 nodes at 1024 -7 %, 3 nodes -3 % (at 512 -7 %);
// 4 nodes +5 % at 1024 and the same at 512, 8 nodes +4 % (kept on tasks). Attention alone,
// caches from DRAM: context 512 decode 104 -> 44 us, batch 4 252 -> 128 us. Values in whole
// rows instead of each thread a stretch of columns of every row (Zen 5 VM, 30 layers' caches
// at context 1024 from DRAM between weight streams): the value pass 0.98 -> 0.5-0.6 ms.
constexpr int64_t kAttentionSplitMaxQueries = 3;

static inline bool attention_splits(int64_t queries, int64_t threads) {
  return threads > 1 && queries <= kAttentionSplitMaxQueries;
}

/// Whole value blocks that fit in `max_len` positions (a split call's per-query block sums).
static inline int64_t attention_value_blocks(int64_t max_len) {
  return max_len / kAttentionValueBlock;
}

/// Floats of split attention's shared workspace: per (sequence, node, head) query its scores
/// and value sums (attention_query_floats), 1 / sum and its whole prefix blocks' sums
/// (attention_value_blocks rows of head_dim, padded); per (sequence, node) its visible tree
/// slots (tree_keys) and their count (int32 in float slots).
static inline int64_t attention_split_floats(int64_t batch, int64_t queries, int64_t q_heads,
                                             int64_t max_len, int64_t tree_keys,
                                             int64_t head_dim) {
  const int64_t nodes = batch * queries;
  const int64_t per_query = attention_query_floats(max_len, head_dim) + 1 +
                            attention_value_blocks(max_len) * attention_row_floats(head_dim);
  return nodes * (q_heads * per_query + tree_keys + 1) + 16;
}

/// Floats of workspace tree_attention needs for these sizes on `threads` threads: the split
/// plan's, else the tasks' per-thread workspace for every thread.
static inline int64_t attention_workspace_total(int64_t batch, int64_t queries, int64_t q_heads,
                                                int64_t kv_heads, int64_t head_dim,
                                                int64_t max_len, int64_t tree_keys,
                                                int64_t threads) {
  if (attention_splits(queries, threads))
    return attention_split_floats(batch, queries, q_heads, max_len, tree_keys, head_dim);
  const AttentionPlan plan = attention_plan(batch, queries, q_heads, kv_heads, threads);
  return threads * attention_workspace_floats(max_len, tree_keys, head_dim,
                                              attention_task_shape(plan, queries));
}

/// The kernels of one instruction set.
struct KernelTable {
  const char* isa;
  void (*linear)(const LinearArgs&);
  void (*rms_norm)(const RmsNormArgs&);
  void (*silu_mul)(const SiluMulArgs&);
  void (*rope)(const RopeArgs&);
  void (*tree_attention)(const AttentionArgs&);
  void (*decoder_layer)(const DecoderLayerArgs&);
  void (*soft_ce_forward)(const SoftCrossEntropyArgs&);
  void (*soft_ce_backward)(const SoftCrossEntropyArgs&);
  void (*topk_log_softmax)(const TopkArgs&);
  void (*eagle2_expand)(const ExpandArgs&);
  void (*build_tree)(const BuildTreeArgs&);
  void (*eagle2_rerank)(const RerankArgs&);
  void (*greedy_accept)(const GreedyAcceptArgs&);
  void (*compact_kv)(const CompactKvArgs&);
  void (*record_tokens)(const RecordArgs&);
  void (*greedy_step)(const GreedyStepArgs&);
};

// Defined in isa_<name>.cpp; avx512 and avx2 exist only on x86-64.
const KernelTable& generic_kernels();
#if defined(__x86_64__)
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
#endif

}  // namespace cpu
}  // namespace eagle_kernels
