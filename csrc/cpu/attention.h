/**
 * @file attention.h
 * @brief CPU tree attention (contract: eagle_kernels.ops.reference.tree_attention, fp32).
 *        Included inside an instruction-set namespace after simd.h.
 *
 * One task = some query heads of some query nodes of one sequence, all reading one KV
 * head (attention_plan in kernels.h); a call with few nodes per sequence shares keys and value
 * columns out instead (tree_attention_split below), with the same arithmetic per query.
 *
 * A query's visible keys, in position order, are the prefix [0, L) and then its tree
 * ancestors (set bits of its mask row) by increasing tree index: an ancestor always has a
 * smaller index than its descendants, so index order is depth order is position order. Over
 * that list:
 *
 *   s_t = (q . k_t) * scale          one lane-wise FMA chain over d + vhsum, per key
 *   m   = max_t s_t                  exact whatever the order
 *   e_t = exp(s_t - m)               vexp, lane-independent
 *   l   = sum_t e_t                  lane l sums t = l (mod kW), then vhsum
 *   out = (sum_t e_t v_t) * (1 / l)  vectorised over d; over t in blocks of
 *                                    kAttentionValueBlock list positions (prefix position t,
 *                                    tree key j of the list at L + j): each block one
 *                                    sequential chain from zero, the block sums added in order
 *
 * Every step depends only on the visible list, never on which cache slots the keys occupy or
 * on the other queries: a tree node at depth d over prefix L reduces exactly as a decode step
 * at position L + d does over the committed cache (row invariance, see kernels.h).
 *
 * Bounds: L is clamped into [0, max_len - tree_keys] and only mask bits below tree_keys are
 * read, so any input stays inside the cache; a query that sees no key gets zeros.
 */

EK_INLINE float dot(const float* a, const float* b, int64_t n) {
  vf acc = vzero();
  int64_t i = 0;
  for (; i + kW <= n; i += kW) acc = vfma(vload(a + i), vload(b + i), acc);
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    acc = vfma(vload_n(a + i, rest), vload_n(b + i, rest), acc);
  }
  return vhsum(acc);
}

/// Keys per block of key_scores: that many independent FMA chains in flight (one chain at a
/// time waits on the FMA latency at every step: a 64-wide dot is 4-8 dependent FMAs), their
/// horizontal sums formed together (vhsum_block, simd.h: 16 keys on AVX-512, 8 elsewhere).
/// Blocks of 8 with a vhsum each took a 16-node layer's attention from 226 to 177 us against
/// one chain at a time; the batched sums of 16 then verify passes (compute-bound) -2.7 / -5.9 %
/// at 16 nodes over 256 / 1024 keys, the decode step (DRAM-bound) within noise (+-4 %).
constexpr int kKeyBlock = kSumBlock;

/// Address of the t-th visible key (or value) row: the prefix in position order, then the
/// visible tree slots.
EK_INLINE const float* visible_row(const float* prefix_rows, const float* tree_rows,
                                   const int32_t* tree_slots, int64_t prefix, int64_t stride,
                                   int64_t t) {
  return t < prefix ? prefix_rows + t * stride
                    : tree_rows + static_cast<int64_t>(tree_slots[t - prefix]) * stride;
}

/// s[t] = dot(q, k_t) * scale for the `count` visible keys. Each score is dot()'s arithmetic
/// exactly (its own chain, vhsum's additions); a block only interleaves kKeyBlock such chains
/// and forms their sums together.
static void key_scores(const float* q, const float* k_prefix, const float* k_tree,
                       const int32_t* tree_slots, int64_t prefix, int64_t count, int64_t stride,
                       int64_t dim, float scale, float* s) {
  int64_t t0 = 0;
  for (; t0 + kKeyBlock <= count; t0 += kKeyBlock) {
    const float* keys[kKeyBlock];  // keys[sum_slot(j)] is key t0 + j (vhsum_block's order)
    vf acc[kKeyBlock];
    for (int j = 0; j < kKeyBlock; ++j) {
      keys[sum_slot(j)] = visible_row(k_prefix, k_tree, tree_slots, prefix, stride, t0 + j);
      acc[j] = vzero();
    }
    int64_t i = 0;
    for (; i + kW <= dim; i += kW) {
      const vf qv = vload(q + i);
      for (int j = 0; j < kKeyBlock; ++j) acc[j] = vfma(qv, vload(keys[j] + i), acc[j]);
    }
    if (i < dim) {
      const int rest = static_cast<int>(dim - i);
      const vf qv = vload_n(q + i, rest);
      for (int j = 0; j < kKeyBlock; ++j) acc[j] = vfma(qv, vload_n(keys[j] + i, rest), acc[j]);
    }
    vhsum_block(acc, scale, s + t0);  // s[t0 + j] = vhsum(acc[sum_slot(j)]) * scale
  }
  for (int64_t t = t0; t < count; ++t)
    s[t] = dot(q, visible_row(k_prefix, k_tree, tree_slots, prefix, stride, t), dim) * scale;
}

/// Softmax weights e_t = exp(s_t - max) in place over `count` scores; returns their sum.
/// Entries [count, padded) are scratch and end as 0.
static float softmax_weights(float* s, int64_t count) {
  const int64_t padded = (count + kW - 1) / kW * kW;
  for (int64_t t = count; t < padded; ++t) s[t] = -__builtin_inff();
  vf best = vset1(-__builtin_inff());
  for (int64_t t = 0; t < padded; t += kW) best = vmax(best, vload(s + t));
  const vf m = vset1(vhmax(best));
  vf sum = vzero();
  for (int64_t t = 0; t < padded; t += kW) {
    const vf e = vexp(vsub(vload(s + t), m));
    vstore(s + t, e);
    sum = vadd(sum, e);
  }
  return vhsum(sum);
}

constexpr int kValueChunks = 8;  ///< vectors of d per pass over the values
static_assert(kAttentionKeyBlock == kAttentionValueBlock,
              "a task's key blocks must be its value blocks (attention_task)");

/// partial[d0, d0 + C * kW) += sum_t e[t] * v_t[d] over `count` visible values, each lane a
/// sequential FMA chain over t continued from `partial` (storing and reloading an fp32 vector
/// is exact, so splitting t into blocks keeps the bits); with kFromZero the chain starts from
/// zero and is then added to `partial` (a whole value block into its query's total). C and
/// whether the last vector is whole are compile-time, so the accumulators stay in registers (a
/// run-time count kept them on the stack) and whole vectors need no masked load. `partial` is
/// padded to whole vectors.
template <int C, bool kWholeLast, bool kFromZero>
static void accumulate_value_chunks(const float* e, int64_t count, const float* prefix_v,
                                    const float* tree_v, const int32_t* tree_slots,
                                    int64_t prefix, int64_t stride, int64_t d0, int last,
                                    float* partial) {
  vf acc[C];
  for (int c = 0; c < C; ++c) acc[c] = kFromZero ? vzero() : vload(partial + d0 + c * kW);
  for (int64_t t = 0; t < count; ++t) {
    const float* v = visible_row(prefix_v, tree_v, tree_slots, prefix, stride, t) + d0;
    const vf p = vset1(e[t]);
    for (int c = 0; c + 1 < C; ++c) acc[c] = vfma(p, vload(v + c * kW), acc[c]);
    acc[C - 1] = vfma(p, kWholeLast ? vload(v + (C - 1) * kW) : vload_n(v + (C - 1) * kW, last),
                      acc[C - 1]);
  }
  for (int c = 0; c < C; ++c)
    vstore(partial + d0 + c * kW, kFromZero ? vadd(vload(partial + d0 + c * kW), acc[c]) : acc[c]);
}

/// accumulate_value_chunks<C, ...> for a run-time chunk count in [1, C].
template <int C, bool kFromZero>
static void accumulate_value_chunks_any(int chunks, const float* e, int64_t count,
                                        const float* prefix_v, const float* tree_v,
                                        const int32_t* tree_slots, int64_t prefix,
                                        int64_t stride, int64_t d0, int last, float* partial) {
  if (chunks == C) {
    if (last == kW)
      return accumulate_value_chunks<C, true, kFromZero>(e, count, prefix_v, tree_v, tree_slots,
                                                         prefix, stride, d0, last, partial);
    return accumulate_value_chunks<C, false, kFromZero>(e, count, prefix_v, tree_v, tree_slots,
                                                        prefix, stride, d0, last, partial);
  }
  if constexpr (C > 1)
    accumulate_value_chunks_any<C - 1, kFromZero>(chunks, e, count, prefix_v, tree_v,
                                                  tree_slots, prefix, stride, d0, last, partial);
}

/// partial[d] += sum_t e[t] * v_t[d] over `count` visible values; d in passes of <= 8 vectors.
/// kFromZero: the sum is one chain from zero, then added to partial (see above).
template <bool kFromZero = false>
static void accumulate_values(const float* e, int64_t count, const float* prefix_v,
                              const float* tree_v, const int32_t* tree_slots, int64_t prefix,
                              int64_t stride, int64_t dim, float* partial) {
  for (int64_t d0 = 0; d0 < dim; d0 += kValueChunks * kW) {
    const int64_t width = dim - d0 < kValueChunks * kW ? dim - d0 : kValueChunks * kW;
    const int chunks = static_cast<int>((width + kW - 1) / kW);
    const int last = static_cast<int>(width - (chunks - 1) * kW);
    accumulate_value_chunks_any<kValueChunks, kFromZero>(chunks, e, count, prefix_v, tree_v,
                                                         tree_slots, prefix, stride, d0, last,
                                                         partial);
  }
}

/// A query's value sums while its visible list is walked in order: `total` holds the closed
/// blocks' sum (in block order), `block` the chain of the block now open (head_dim each,
/// padded to whole vectors).
struct ValueSums {
  float* total;
  float* block;
};

EK_INLINE void zero_value_sums(ValueSums sums, int64_t dim) {
  for (int64_t d = 0; d < dim; d += kW) {
    vstore(sums.total + d, vzero());
    vstore(sums.block + d, vzero());
  }
}

/// total += block; block = 0: the open block is done.
EK_INLINE void close_value_block(ValueSums sums, int64_t dim) {
  for (int64_t d = 0; d < dim; d += kW) {
    vstore(sums.total + d, vadd(vload(sums.total + d), vload(sums.block + d)));
    vstore(sums.block + d, vzero());
  }
}

/// Values of list positions [position, position + count) into `sums`: entry t of e and of the
/// rows (visible_row's prefix rows, then tree slots) is position `position + t`. A block closes
/// where a position is a multiple of kAttentionValueBlock, so walking a query's list in any
/// number of calls, in order, gives the same bits; so does adding a whole block to the total
/// directly (accumulate_values<true>) when no block is open: closing an empty block adds +0 to
/// a total that is never -0 (a chain from +0 of products and sums never gives -0), no change.
static void accumulate_in_blocks(const float* e, int64_t position, int64_t count,
                                 const float* prefix_v, const float* tree_v,
                                 const int32_t* tree_slots, int64_t prefix, int64_t stride,
                                 int64_t dim, ValueSums sums) {
  for (int64_t t = 0; t < count;) {
    const int64_t at = position + t, in_block = at % kAttentionValueBlock;
    if (at > 0 && in_block == 0) close_value_block(sums, dim);
    int64_t run = count - t < kAttentionValueBlock - in_block ? count - t
                                                              : kAttentionValueBlock - in_block;
    if (t < prefix) {  // prefix rows, never past them in one run
      if (run > prefix - t) run = prefix - t;
      accumulate_values(e + t, run, prefix_v + t * stride, nullptr, nullptr, run, stride, dim,
                        sums.block);
    } else {
      accumulate_values(e + t, run, nullptr, tree_v, tree_slots + (t - prefix), 0, stride, dim,
                        sums.block);
    }
    t += run;
  }
}

/// out = (total + the open block) * inverse, the query's output row (`dim` floats).
EK_INLINE void finish_values(ValueSums sums, int64_t dim, float inverse, float* out) {
  close_value_block(sums, dim);
  const vf scale = vset1(inverse);
  for (int64_t d = 0; d < dim; d += kW) {
    const int n = static_cast<int>(dim - d < kW ? dim - d : kW);
    vstore_n(out + d, vmul(vload(sums.total + d), scale), n);
  }
}

/// Floats per 64-byte cache line: the step of the prefetch loops below.
constexpr int64_t kLineFloats = 64 / sizeof(float);

/// Asks for rows [t0, t1) of a cache (`stride` floats apart, `dim` floats each), a line at a
/// time, into L1: a pass's first block, which it is about to use (the hardware prefetcher,
/// facing 256-byte rows 768 bytes apart, requests few). The blocks after it come in shares
/// (BlockAhead). Never changes what is computed.
static void prefetch_rows(const float* rows, int64_t t0, int64_t t1, int64_t stride, int64_t dim) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t d = 0; d < dim; d += kLineFloats) __builtin_prefetch(rows + t * stride + d, 0, 3);
}

/// The next block of a pass's cache rows (rows [t0, t1), `dim` floats each, `stride` floats
/// apart), asked for in `parts` equal shares of rows, share i just before the pass's i-th piece
/// of work on the current block, with prefetcht1 (into L2 on the Zen 4 / Zen 5 VMs measured;
/// older AMD cores treat it as prefetcht0). Asking for the whole next block at once into L1
/// (as prefetch_rows does) stalled the thread on its miss buffers until most of it had come, so
/// DRAM and the FMA units took turns, and the 48 KB block pushed the one in use out of the
/// 32 KB L1. Measured (Zen 4-class VM, 2 threads, 30 layers' SmolLM2 caches, one decode query,
/// in-process A/B against the burst, bench/results/2026-11-27b_cpu-2core/ab_attention.txt):
/// attention at 256 / 1024 / 2048 / 4096 keys 0.98 / 0.75 / 0.74 / 0.72x. Asking two blocks
/// ahead measured 4-12 % slower than one. Never changes what is computed. Made by block_ahead
/// (parts >= 1).
struct BlockAhead {
  const float* rows;
  int64_t t0, t1, stride, dim, parts;

  EK_INLINE void ask(int64_t part) const {
    const int64_t count = t1 - t0;
    const int64_t begin = t0 + count * part / parts, end = t0 + count * (part + 1) / parts;
    for (int64_t t = begin; t < end; ++t)
      for (int64_t d = 0; d < dim; d += kLineFloats)
        __builtin_prefetch(rows + t * stride + d, 0, 2);
  }
};

/// Rows [t0, t1) of a cache, in `parts` shares (see BlockAhead).
static BlockAhead block_ahead(const float* rows, int64_t t0, int64_t t1, int64_t stride,
                              int64_t dim, int64_t parts) {
  return {rows, t0, t1 > t0 ? t1 : t0, stride, dim, parts > 0 ? parts : 1};
}

/// The prefix block after the one ending at `from` (at most kAttentionKeyBlock rows, none past
/// `prefix`), in `parts` shares.
static BlockAhead next_block_ahead(const float* rows, int64_t from, int64_t prefix,
                                   int64_t stride, int64_t dim, int64_t parts) {
  const int64_t end = from + kAttentionKeyBlock < prefix ? from + kAttentionKeyBlock : prefix;
  return block_ahead(rows, from, end, stride, dim, parts);
}

/// The queries of one task: nodes [n0, n1) x query heads [h0, h1) of sequence b, all reading
/// the same KV head, so every prefix key and value row is loaded into L1 once per task and used
/// by all of its queries (one query at a time re-read each row from L2: 512 bytes per key
/// against 16 FMAs, L2-bound).
struct AttentionTask {
  int64_t b, n0, n1, h0, h1;
};

/// Where one query keeps its scores and its value sums (attention_query_floats floats).
struct QueryScratch {
  float* scores;
  ValueSums sums;
};

EK_INLINE QueryScratch query_floats(float* at, int64_t max_len, int64_t head_dim) {
  float* total = at + attention_scores_floats(max_len);
  return {at, {total, total + attention_row_floats(head_dim)}};
}

EK_INLINE QueryScratch query_scratch(const AttentionArgs& a, float* workspace, int64_t query) {
  return query_floats(workspace + query * attention_query_floats(a.max_len, a.head_dim),
                      a.max_len, a.head_dim);
}

/// Visible tree slots of node `node` (of B * Nq: its mask bits below tree_keys) into `slots`;
/// returns their count.
static int32_t node_tree_slots(const AttentionArgs& a, int64_t node, int32_t* slots) {
  const int32_t* row = a.tree_mask + node * a.words;
  int32_t count = 0;
  for (int64_t j = 0; j < a.tree_keys; ++j)
    if ((static_cast<uint32_t>(row[j / 32]) >> (j % 32)) & 1u)
      slots[count++] = static_cast<int32_t>(j);
  return count;
}

/// Visible tree slots of nodes [n0, n1) into `slots`, one row of tree_keys per node; their
/// counts into `visible`.
static void visible_tree_slots(const AttentionArgs& a, const AttentionTask& task, int32_t* slots,
                               int64_t* visible) {
  for (int64_t i = task.n0; i < task.n1; ++i)
    visible[i - task.n0] =
        node_tree_slots(a, task.b * a.queries + i, slots + (i - task.n0) * a.tree_keys);
}

/// Scores, softmax and values of every query of a task. Each query's arithmetic is the one
/// the file header states, whatever the task holds: keys go in blocks of kAttentionKeyBlock
/// prefix rows (all queries over one block, then the next), which changes only when a row is
/// loaded, never the order in which a query's sums are formed.
static void attention_task(const AttentionArgs& a, const AttentionTask& task, float* workspace) {
  const int64_t group = a.q_heads / a.kv_heads, dim = a.head_dim;
  const int64_t kvh = task.h0 / group, heads = task.h1 - task.h0, nodes = task.n1 - task.n0;
  const int64_t stride = a.kv_heads * dim;  // between consecutive cache positions
  int64_t prefix = a.lens[task.b];
  prefix = prefix < 0 ? 0 : (prefix > a.max_len - a.tree_keys ? a.max_len - a.tree_keys : prefix);
  const int64_t base = task.b * a.max_len * stride + kvh * dim;
  const float* k_prefix = a.k_cache + base;
  const float* v_prefix = a.v_cache + base;
  const float* k_tree = k_prefix + prefix * stride;
  const float* v_tree = v_prefix + prefix * stride;
  const int64_t task_queries = nodes * heads;  // (node, head) pairs, node-major
  int32_t* slots = reinterpret_cast<int32_t*>(
      workspace + task_queries * attention_query_floats(a.max_len, dim));
  int64_t visible[kAttentionTaskNodes];
  visible_tree_slots(a, task, slots, visible);
  auto query_offset = [&](int64_t q) {  // of task query q in a.q and a.out
    return ((task.b * a.queries + task.n0 + q / heads) * a.q_heads + task.h0 + q % heads) * dim;
  };
  // Prefix rows are requested a block ahead of use: the next block's keys while this block's
  // scores run, the next block's values while this block's sums run, a share before each
  // query's work (BlockAhead; each pass's first block at its start). Against asking for the
  // whole next block at once (in-process A/B, the target's forward, 2 threads): verify of 4
  // nodes at 256 / 1024 tokens of context -2 / -14 %, 8 nodes at 256 / 512 -3 / -5 %, 16 nodes
  // at 1024 -7 %. (Asking a block's values during its scores instead measured the same as
  // asking them during the values pass, but a long prefix would evict them before use.)
  for (int64_t t0 = 0; t0 < prefix; t0 += kAttentionKeyBlock) {
    const int64_t keys = prefix - t0 < kAttentionKeyBlock ? prefix - t0 : kAttentionKeyBlock;
    if (t0 == 0) prefetch_rows(k_prefix, 0, keys, stride, dim);
    const BlockAhead ahead = next_block_ahead(k_prefix, t0 + keys, prefix, stride, dim,
                                              task_queries);
    for (int64_t q = 0; q < task_queries; ++q) {
      ahead.ask(q);
      key_scores(a.q + query_offset(q), k_prefix + t0 * stride, nullptr, nullptr, keys, keys,
                 stride, dim, a.scale, query_scratch(a, workspace, q).scores + t0);
    }
  }
  float inverse[kAttentionTaskNodes * kAttentionMaxGroup];
  for (int64_t q = 0; q < task_queries; ++q) {
    const int64_t node = q / heads, count = prefix + visible[node];
    const QueryScratch scratch = query_scratch(a, workspace, q);
    key_scores(a.q + query_offset(q), nullptr, k_tree, slots + node * a.tree_keys, 0,
               visible[node], stride, dim, a.scale, scratch.scores + prefix);
    inverse[q] = count > 0 ? 1.0f / softmax_weights(scratch.scores, count) : 0.0f;
    zero_value_sums(scratch.sums, dim);
  }
  // Key blocks are value blocks (static_assert above): a whole one goes straight into the
  // total; the last, part of a block, opens the block the tree keys continue.
  for (int64_t t0 = 0; t0 < prefix; t0 += kAttentionKeyBlock) {
    const int64_t keys = prefix - t0 < kAttentionKeyBlock ? prefix - t0 : kAttentionKeyBlock;
    if (t0 == 0) prefetch_rows(v_prefix, 0, keys, stride, dim);
    const BlockAhead ahead = next_block_ahead(v_prefix, t0 + keys, prefix, stride, dim,
                                              task_queries);
    for (int64_t q = 0; q < task_queries; ++q) {
      ahead.ask(q);
      const QueryScratch scratch = query_scratch(a, workspace, q);
      if (keys == kAttentionValueBlock)
        accumulate_values<true>(scratch.scores + t0, keys, v_prefix + t0 * stride, nullptr,
                                nullptr, keys, stride, dim, scratch.sums.total);
      else
        accumulate_in_blocks(scratch.scores + t0, t0, keys, v_prefix + t0 * stride, nullptr,
                             nullptr, keys, stride, dim, scratch.sums);
    }
  }
  // Tree keys' values, then the output (a query that sees no key gets zeros: inverse 0).
  for (int64_t q = 0; q < task_queries; ++q) {
    const int64_t node = q / heads;
    const QueryScratch scratch = query_scratch(a, workspace, q);
    accumulate_in_blocks(scratch.scores + prefix, prefix, visible[node], nullptr, v_tree,
                         slots + node * a.tree_keys, 0, stride, dim, scratch.sums);
    finish_values(scratch.sums, dim, inverse[q], a.out + query_offset(q));
  }
}

// ------------------------------------------------------------------------ split attention
//
// Few queries per sequence (kernels.h attention_splits): threads share out keys and value rows
// instead of whole queries. Per query the arithmetic is the header's, step for step: each
// score is key_scores' chain, the softmax runs over the query's whole list, and the value sums
// are the same blocks (each one chain from zero) added in the same order, so a split call
// gives the bits a task call gives.

/// Where a split call keeps its state in the shared workspace (attention_split_floats).
struct SplitLayout {
  int64_t per_query;   ///< floats per (sequence, node, head) query: scores, then value sums
  int64_t per_blocks;  ///< floats of one query's whole-prefix-block sums
  float* queries;      ///< [B * Nq * Hq, per_query]
  float* inverse;      ///< [B * Nq * Hq] 1 / softmax sum (0 for a query that sees no key)
  float* blocks;       ///< [B * Nq * Hq, per_blocks]: block i's sum at i * row floats
  int32_t* slots;      ///< [B * Nq, tree_keys] visible tree slots of each node
  int32_t* visible;    ///< [B * Nq] their count

  QueryScratch query(const AttentionArgs& a, int64_t q) const {
    return query_floats(queries + q * per_query, a.max_len, a.head_dim);
  }
  float* block_sum(const AttentionArgs& a, int64_t q, int64_t block) const {
    return blocks + q * per_blocks + block * attention_row_floats(a.head_dim);
  }
};

static SplitLayout split_layout(const AttentionArgs& a) {
  const int64_t nodes = a.batch * a.queries, queries = nodes * a.q_heads;
  SplitLayout l;
  l.per_query = attention_query_floats(a.max_len, a.head_dim);
  l.per_blocks = attention_value_blocks(a.max_len) * attention_row_floats(a.head_dim);
  l.queries = a.workspace;
  l.inverse = l.queries + queries * l.per_query;
  l.blocks = l.inverse + queries;
  l.slots = reinterpret_cast<int32_t*>(l.blocks + queries * l.per_blocks);
  l.visible = l.slots + nodes * a.tree_keys;
  return l;
}

/// Sequence b's prefix length, clamped as attention_task clamps it.
EK_INLINE int64_t clamped_prefix(const AttentionArgs& a, int64_t b) {
  const int64_t prefix = a.lens[b];
  return prefix < 0 ? 0 : (prefix > a.max_len - a.tree_keys ? a.max_len - a.tree_keys : prefix);
}

/// Scores of every query of sequence b over prefix block [t0, t0 + keys); before each query's,
/// a share of the next block is asked for (`ahead`, one part per query).
static void split_block_scores(const AttentionArgs& a, const SplitLayout& l, int64_t b,
                               int64_t t0, int64_t keys, const BlockAhead& ahead) {
  const int64_t group = a.q_heads / a.kv_heads, stride = a.kv_heads * a.head_dim;
  const float* block = a.k_cache + (b * a.max_len + t0) * stride;
  const int64_t first = b * a.queries * a.q_heads;
  for (int64_t query = first; query < (b + 1) * a.queries * a.q_heads; ++query) {
    ahead.ask(query - first);
    const int64_t kv_head = query % a.q_heads / group;
    key_scores(a.q + query * a.head_dim, block + kv_head * a.head_dim, nullptr, nullptr, keys,
               keys, stride, a.head_dim, a.scale, l.query(a, query).scores + t0);
  }
}

/// Units of work over sequences' prefixes, `per_unit` positions each (the last of a sequence
/// short, unless `whole`: then only whole units), and this thread's contiguous share
/// [first, end) of them; calls `body(b, t0, keys, next_end, first, last)` for each: next_end
/// where the thread's next unit of that sequence ends (t0 + keys when it has none), first for
/// its first unit, last for its last.
template <typename Body>
static void prefix_units(const AttentionArgs& a, int64_t per_unit, bool whole, int64_t thread,
                         int64_t threads, Body&& body) {
  auto units_of = [&](int64_t b) {
    const int64_t prefix = clamped_prefix(a, b);
    return whole ? prefix / per_unit : (prefix + per_unit - 1) / per_unit;
  };
  int64_t units = 0;
  for (int64_t b = 0; b < a.batch; ++b) units += units_of(b);
  const int64_t first = units * thread / threads, end = units * (thread + 1) / threads;
  int64_t unit = 0;
  for (int64_t b = 0; b < a.batch && unit < end; ++b) {
    const int64_t prefix = clamped_prefix(a, b), count = units_of(b);
    for (int64_t i = 0; i < count && unit < end; ++i, ++unit) {
      if (unit < first) continue;
      const int64_t t0 = i * per_unit, keys = prefix - t0 < per_unit ? prefix - t0 : per_unit;
      const bool next = unit + 1 < end && i + 1 < count;
      const int64_t after = t0 + keys + per_unit < prefix ? t0 + keys + per_unit : prefix;
      body(b, t0, keys, next ? after : t0 + keys, unit == first, unit + 1 == end);
    }
  }
}

/// This thread's first unit of prefix_units(per_unit, whole): rows [t0, t0 + keys) of
/// sequence b (keys 0: none).
struct PrefixUnit {
  int64_t b, t0, keys;
};
static PrefixUnit first_prefix_unit(const AttentionArgs& a, int64_t per_unit, bool whole,
                                    int64_t thread, int64_t threads) {
  PrefixUnit unit{0, 0, 0};
  prefix_units(a, per_unit, whole, thread, threads,
               [&](int64_t b, int64_t t0, int64_t keys, int64_t, bool first, bool) {
    if (first) unit = {b, t0, keys};
  });
  return unit;
}

/// LookAhead::first of an AttentionArgs: the first key block thread t scores in
/// tree_attention_split; none where the call does not split (the q/k/v GEMM before it asks
/// for these rows during its last tile: each thread's first block came from DRAM in a burst).
static LineRange attention_first_keys(const void* what, int64_t t, int64_t threads) {
  const AttentionArgs& a = *static_cast<const AttentionArgs*>(what);
  if (!attention_splits(a.queries, threads)) return {nullptr, 0};
  const int64_t row = a.kv_heads * a.head_dim;  // every KV head's: whole rows, contiguous
  const PrefixUnit unit = first_prefix_unit(a, kAttentionKeyBlock, false, t, threads);
  return {reinterpret_cast<const char*>(a.k_cache + (unit.b * a.max_len + unit.t0) * row),
          unit.keys * row * static_cast<int64_t>(sizeof(float)) / 64};
}

/// This thread's share of the prefix scores: a contiguous run of (sequence, key block) units,
/// whole cache rows (every KV head) asked for a block ahead (BlockAhead), so the rows stream
/// from DRAM while the block before them is scored; during its last, the first value block
/// the thread sums next (split_value_blocks).
static void split_prefix_scores(const AttentionArgs& a, const SplitLayout& l, int64_t thread,
                                int64_t threads) {
  const int64_t row = a.kv_heads * a.head_dim, parts = a.queries * a.q_heads;
  prefix_units(a, kAttentionKeyBlock, false, thread, threads,
               [&](int64_t b, int64_t t0, int64_t keys, int64_t next_end, bool first, bool last) {
    const float* rows = a.k_cache + b * a.max_len * row;
    if (first) prefetch_rows(rows, t0, t0 + keys, row, row);
    BlockAhead ahead = block_ahead(rows, t0 + keys, next_end, row, row, parts);
    if (last) {
      const PrefixUnit values =
          first_prefix_unit(a, kAttentionValueBlock, true, thread, threads);
      if (values.keys > 0)
        ahead = block_ahead(a.v_cache + values.b * a.max_len * row, values.t0,
                            values.t0 + values.keys, row, row, parts);
    }
    split_block_scores(a, l, b, t0, keys, ahead);
  });
}

/// This thread's share of the whole prefix value blocks: a contiguous run of (sequence, value
/// block) units, whole rows asked for a block ahead (BlockAhead, a share before each query);
/// each block's sum (one chain from zero) for every query of its sequence goes to that query's
/// block_sum.
static void split_value_blocks(const AttentionArgs& a, const SplitLayout& l, int64_t thread,
                               int64_t threads) {
  const int64_t group = a.q_heads / a.kv_heads, row = a.kv_heads * a.head_dim;
  const int64_t parts = a.queries * a.q_heads;
  prefix_units(a, kAttentionValueBlock, true, thread, threads,
               [&](int64_t b, int64_t t0, int64_t keys, int64_t next_end, bool first, bool) {
    const float* rows = a.v_cache + b * a.max_len * row;
    if (first) prefetch_rows(rows, t0, t0 + keys, row, row);
    const BlockAhead ahead = block_ahead(rows, t0 + keys, next_end, row, row, parts);
    const int64_t first_query = b * a.queries * a.q_heads;
    for (int64_t query = first_query; query < (b + 1) * a.queries * a.q_heads; ++query) {
      ahead.ask(query - first_query);
      float* sum = l.block_sum(a, query, t0 / kAttentionValueBlock);
      for (int64_t d = 0; d < a.head_dim; d += kW) vstore(sum + d, vzero());
      const float* v = rows + t0 * row + query % a.q_heads / group * a.head_dim;
      accumulate_values(l.query(a, query).scores + t0, keys, v, nullptr, nullptr, keys, row,
                        a.head_dim, sum);
    }
  });
}

/// Tree scores, the softmax and the zeroed value sums of query `query`.
static void split_tree_scores_and_softmax(const AttentionArgs& a, const SplitLayout& l,
                                          int64_t query) {
  const int64_t node = query / a.q_heads, b = node / a.queries;
  const int64_t group = a.q_heads / a.kv_heads, stride = a.kv_heads * a.head_dim;
  const int64_t prefix = clamped_prefix(a, b), count = prefix + l.visible[node];
  const float* k_tree =
      a.k_cache + (b * a.max_len + prefix) * stride + query % a.q_heads / group * a.head_dim;
  const QueryScratch scratch = l.query(a, query);
  key_scores(a.q + query * a.head_dim, nullptr, k_tree, l.slots + node * a.tree_keys, 0,
             l.visible[node], stride, a.head_dim, a.scale, scratch.scores + prefix);
  l.inverse[query] = count > 0 ? 1.0f / softmax_weights(scratch.scores, count) : 0.0f;
  zero_value_sums(scratch.sums, a.head_dim);
}

/// Query `query`'s value sums from its whole prefix blocks' sums (in order, as the open
/// block closes each), then its last part-block of prefix rows and its tree keys, and its
/// output row.
static void split_finish_query(const AttentionArgs& a, const SplitLayout& l, int64_t query) {
  const int64_t node = query / a.q_heads, b = node / a.queries;
  const int64_t group = a.q_heads / a.kv_heads, stride = a.kv_heads * a.head_dim;
  const int64_t prefix = clamped_prefix(a, b), whole = prefix / kAttentionValueBlock;
  const QueryScratch scratch = l.query(a, query);
  for (int64_t i = 0; i < whole; ++i) {
    const float* sum = l.block_sum(a, query, i);
    for (int64_t d = 0; d < a.head_dim; d += kW)
      vstore(scratch.sums.total + d, vadd(vload(scratch.sums.total + d), vload(sum + d)));
  }
  const int64_t t0 = whole * kAttentionValueBlock;
  const float* v = a.v_cache + b * a.max_len * stride + query % a.q_heads / group * a.head_dim;
  accumulate_in_blocks(scratch.scores + t0, t0, prefix - t0, v + t0 * stride, nullptr, nullptr,
                       prefix - t0, stride, a.head_dim, scratch.sums);
  accumulate_in_blocks(scratch.scores + prefix, prefix, l.visible[node], nullptr,
                       v + prefix * stride, l.slots + node * a.tree_keys, 0, stride, a.head_dim,
                       scratch.sums);
  finish_values(scratch.sums, a.head_dim, l.inverse[query], a.out + query * a.head_dim);
}

/// The split plan: tree slots, prefix scores (key blocks shared out), tree scores and softmax
/// (queries shared out), whole prefix value blocks (shared out), then each query's sums and
/// output (queries shared out); each phase waits for the one before.
static void tree_attention_split(const AttentionArgs& a) {
  const SplitLayout l = split_layout(a);
  const int64_t nodes = a.batch * a.queries, queries = nodes * a.q_heads;
#pragma omp parallel num_threads(a.threads)
  {
    const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
#pragma omp for schedule(static)
    for (int64_t node = 0; node < nodes; ++node)
      l.visible[node] = node_tree_slots(a, node, l.slots + node * a.tree_keys);
    split_prefix_scores(a, l, thread, threads);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t query = 0; query < queries; ++query) split_tree_scores_and_softmax(a, l, query);
    split_value_blocks(a, l, thread, threads);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t query = 0; query < queries; ++query) split_finish_query(a, l, query);
  }
}

static void tree_attention(const AttentionArgs& a) {
  if (attention_splits(a.queries, a.threads)) return tree_attention_split(a);
  const AttentionPlan plan = attention_plan(a.batch, a.queries, a.q_heads, a.kv_heads, a.threads);
  const int64_t node_blocks = plan.node_blocks;
  const int64_t head_blocks = a.q_heads / plan.heads;
  const int64_t tasks = a.batch * node_blocks * head_blocks;
  const int64_t per_thread = attention_workspace_floats(
      a.max_len, a.tree_keys, a.head_dim, attention_task_shape(plan, a.queries));
#pragma omp parallel num_threads(a.threads)
  {
    float* workspace = a.workspace + omp_get_thread_num() * per_thread;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t h = task % head_blocks, n = (task / head_blocks) % node_blocks;
      const int64_t n0 = a.queries * n / node_blocks, n1 = a.queries * (n + 1) / node_blocks;
      attention_task(a, {task / (head_blocks * node_blocks), n0, n1, h * plan.heads,
                         (h + 1) * plan.heads}, workspace);
    }
  }
}
