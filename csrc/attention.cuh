/**
 * @file attention.cuh
 * @brief Tree attention: tree-node queries over the NHD KV-cache prefix plus their ancestors.
 *
 * Contract: eagle_kernels.ops.reference.tree_attention. For sequence b with L = cache_lens[b],
 * query i (of Nq) sees every prefix key [0, L) and tree key j (cache row L + j, j < T) iff bit
 * j % 32 of tree_mask[b, i, j / 32] is set; query head h reads KV head h / group.
 *
 * The kernel (attention.cu): one CTA per (row tile, KV head, sequence, split). The group query
 * heads of one KV head are stacked as rows, row r = (query r / group, head r % group), so each
 * K/V block is read once for the whole group. Four warps own 16 rows each; per 64-key block
 * S = Q K^T and O += P V run on tensor cores (WMMA 16x16x16, fp32 accumulate), the online
 * softmax in fp32 between them, with O kept in shared memory so the per-row rescale is plain
 * code. A block of tree keys that no row of the tile sees is skipped (a CTA-wide vote) before
 * its K / V are read: half the blocks of a prefill chain. Split-KV: each sequence's range [0, L + T) is cut into `num_splits` chunks of a
 * multiple of kBlockN keys (from the device-side length: no host sync); splits write
 * normalised partial outputs and base-2 log-sum-exps, which a second kernel merges.
 *
 * The scalar pieces below (split geometry, key visibility, the online-softmax update, the
 * merge) are EK_HOST_DEVICE and shared with tree_attention_host, which runs the same tiling
 * on CPU with scalar dot products in place of the MMAs: how CI checks the kernel's logic.
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "common.cuh"

namespace eagle_kernels {
namespace attention {

constexpr int kBlockM = 64;   ///< stacked query rows per CTA (4 warps x 16)
constexpr int kBlockN = 64;   ///< keys per block
constexpr int kThreads = 128;
constexpr int kMaxSplits = 256;
/// Head sizes the kernel is instantiated for (tensor-core tiles of 16; size_error checks).
constexpr int kHeadDims[2] = {64, 128};

/// Sizes and strides of one call (element strides; the head dimension is contiguous).
struct Problem {
  int64_t batch, num_queries, q_heads, kv_heads, head_dim, tree_keys, words;
  int64_t stride_qb, stride_qn, stride_qh;  ///< q and out (out is allocated like q)
  int64_t stride_kb, stride_kn, stride_kh;  ///< k_cache and v_cache (same shape)
  int64_t num_splits;
  float scale_log2;  ///< sm_scale * log2(e): logits in base 2, so exp2 is the exponential
};

/// Keys [begin, end) of split `split` of a sequence with `total` = L + T keys.
struct KeyRange {
  int64_t begin, end;
};

EK_HOST_DEVICE KeyRange split_range(int64_t total, int64_t num_splits, int64_t split) {
  const int64_t chunk = ceil_div(ceil_div(total, num_splits), kBlockN) * kBlockN;
  const int64_t begin = split * chunk;
  const int64_t end = begin + chunk < total ? begin + chunk : total;
  return {begin, end};
}

/**
 * @brief The prefix length actually used for `cache_len` = cache_lens[b]: clamped to
 *        [0, max_len - T] (max_len = stride_kb / stride_kn, the cache is contiguous), so every
 *        key read lies inside the sequence's cache whatever cache_lens holds. The Python op
 *        rejects such lengths while value checks are on; the Triton kernel clamps alike.
 */
EK_HOST_DEVICE int64_t clamped_prefix(int64_t cache_len, const Problem& p) {
  const int64_t last = p.stride_kb / p.stride_kn - p.tree_keys;
  const int64_t prefix = cache_len < last ? cache_len : last;
  return prefix > 0 ? prefix : 0;
}

/// Whether cache row `pos` (< the split's end) is visible to the query whose mask row is
/// `mask_row` (tree_mask[b, i, :]): prefix rows always, tree node pos - prefix by its bit.
EK_HOST_DEVICE bool key_visible(int64_t pos, int64_t prefix, const int32_t* mask_row) {
  if (pos < prefix) return true;
  const int64_t node = pos - prefix;
  return (static_cast<uint32_t>(mask_row[node / kMaskWordBits]) >> (node % kMaskWordBits)) & 1u;
}

/// Running max and sum of one row (base-2 logits). A row with no visible key so far keeps
/// max = -inf; exponentials then subtract 0 instead, which gives exp2(-inf) = 0, never NaN.
struct RowState {
  float max, sum;

  /// Fold in a block whose largest visible logit is `block_max` (-inf: none visible);
  /// returns the factor that rescales the previous sum and output. Call then add the block's
  /// weights (weight()) to `sum`.
  EK_HOST_DEVICE float rescale(float block_max) {
    const float updated = block_max > max ? block_max : max;
    const float factor = exp2f(max - offset(updated));
    max = updated;
    sum *= factor;
    return factor;
  }
  EK_HOST_DEVICE float weight(float logit) const { return exp2f(logit - offset(max)); }
  /// 1 / sum, or 0 for a row that saw nothing (its output is then zeros, as the reference's).
  EK_HOST_DEVICE float inverse_sum() const { return sum > 0.0f ? 1.0f / sum : 0.0f; }
  /// Base-2 log-sum-exp of the row (-inf when it saw nothing): what a split hands the merge.
  EK_HOST_DEVICE float lse() const { return sum > 0.0f ? max + log2f(sum) : -INFINITY; }

 private:
  EK_HOST_DEVICE static float offset(float m) { return m == -INFINITY ? 0.0f : m; }
};

/// Weight of a split in the merge: 2^(lse - top), top = the largest lse of the row's splits.
EK_HOST_DEVICE float merge_weight(float lse, float top) {
  return exp2f(lse - (top == -INFINITY ? 0.0f : top));
}

/// float -> storage type, round to nearest (host and device).
EK_HOST_DEVICE void store_as(float x, float* out) { *out = x; }
EK_HOST_DEVICE void store_as(float x, __half* out) { *out = __float2half_rn(x); }
EK_HOST_DEVICE void store_as(float x, __nv_bfloat16* out) { *out = __float2bfloat16_rn(x); }

/// Why these sizes cannot run, or nullptr when they can (bindings raise ValueError).
inline const char* size_error(const Problem& p, int dtype_code) {
  if (dtype_code != kFloat16 && dtype_code != kBFloat16) {
    return "tree_attention: dtype_code must be 1 (float16) or 2 (bfloat16)";
  }
  if (p.head_dim != kHeadDims[0] && p.head_dim != kHeadDims[1]) {
    return "tree_attention: head_dim must be 64 or 128";
  }
  if (p.batch < 0 || p.batch > 65535) return "tree_attention: batch must be in [0, 65535]";
  if (p.num_queries < 1 || p.tree_keys < 1) {
    return "tree_attention: num_queries and tree_keys must be >= 1";
  }
  if (p.kv_heads < 1 || p.q_heads % p.kv_heads != 0) {
    return "tree_attention: kv_heads must divide q_heads";
  }
  if (p.words != ceil_div(p.tree_keys, kMaskWordBits)) {
    return "tree_attention: words must be ceil(tree_keys / 32)";
  }
  if (p.num_splits < 1 || p.num_splits > kMaxSplits) {
    return "tree_attention: num_splits must be in [1, 256]";
  }
  if (p.num_queries * (p.q_heads / p.kv_heads) > (int64_t{1} << 31) - kBlockM) {
    return "tree_attention: num_queries * group too large";
  }
  return nullptr;
}

}  // namespace attention

/**
 * @brief Launch tree attention (device pointers, on `stream`).
 *
 * @param q          [B, Nq, Hq, D] fp16 / bf16 (strides in `p`, 16-byte aligned rows)
 * @param k_cache, v_cache  [B, max_len, Hkv, D], dtype of q
 * @param cache_lens [B] int32;  tree_mask [B, Nq, words] int32
 * @param out        [B, Nq, Hq, D], dtype and strides of q
 * @param part_o, part_lse  fp32 workspaces [B, S, Nq, Hq, D] and [B, S, Nq, Hq] (unused when
 *                   p.num_splits == 1; then out is written directly); out must be contiguous
 *                   when p.num_splits > 1
 */
cudaError_t launch_tree_attention(const void* q, const void* k_cache, const void* v_cache,
                                  const int32_t* cache_lens, const int32_t* tree_mask, void* out,
                                  float* part_o, float* part_lse,
                                  const attention::Problem& p, int dtype_code,
                                  cudaStream_t stream);

/// Host twin (host pointers, synchronous): the kernel's tiling and per-row code with scalar
/// dot products (P rounded to the input dtype before P V, as the kernel does).
void tree_attention_host(const void* q, const void* k_cache, const void* v_cache,
                         const int32_t* cache_lens, const int32_t* tree_mask, void* out,
                         float* part_o, float* part_lse, const attention::Problem& p,
                         int dtype_code);

}  // namespace eagle_kernels
