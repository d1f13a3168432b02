/**
 * @file attention.h
 * @brief CPU tree attention (contract: eagle_kernels.ops.reference.tree_attention, fp32).
 *        Included inside an instruction-set namespace after simd.h.
 *
 * One task = one query head of one query node of one sequence. A query's visible keys, in
 * position order, are the prefix [0, L) and then its tree ancestors (set bits of its mask row)
 * by increasing tree index: an ancestor always has a smaller index than its descendants, so
 * index order is depth order is position order. Over that list:
 *
 *   s_t = (q . k_t) * scale          one lane-wise FMA chain over d + vhsum, per key
 *   m   = max_t s_t                  exact whatever the order
 *   e_t = exp(s_t - m)               vexp, lane-independent
 *   l   = sum_t e_t                  lane l sums t = l (mod kW), then vhsum
 *   out = (sum_t e_t v_t) * (1 / l)  sequential over t, vectorised over d
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

/// Keys per block of key_scores: that many independent FMA chains in flight. One chain at a
/// time waits on the FMA latency at every step (a 64-wide dot: 8 dependent FMAs, then vhsum).
/// Not measured on its own: with the tasks per query head and the register-resident values it
/// took a 16-node layer's attention from 226 to 177 us; a decode step's (K/V from DRAM) stayed.
constexpr int kKeyBlock = 8;

/// Address of the t-th visible key (or value) row: the prefix in position order, then the
/// visible tree slots.
EK_INLINE const float* visible_row(const float* prefix_rows, const float* tree_rows,
                                   const int32_t* tree_slots, int64_t prefix, int64_t stride,
                                   int64_t t) {
  return t < prefix ? prefix_rows + t * stride
                    : tree_rows + static_cast<int64_t>(tree_slots[t - prefix]) * stride;
}

/// s[t] = dot(q, k_t) * scale for the `count` visible keys. Each score is dot()'s arithmetic
/// exactly (its own chain, its own vhsum); a block only interleaves kKeyBlock such chains.
static void key_scores(const float* q, const float* k_prefix, const float* k_tree,
                       const int32_t* tree_slots, int64_t prefix, int64_t count, int64_t stride,
                       int64_t dim, float scale, float* s) {
  int64_t t0 = 0;
  for (; t0 + kKeyBlock <= count; t0 += kKeyBlock) {
    const float* keys[kKeyBlock];
    vf acc[kKeyBlock];
    for (int j = 0; j < kKeyBlock; ++j) {
      keys[j] = visible_row(k_prefix, k_tree, tree_slots, prefix, stride, t0 + j);
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
    for (int j = 0; j < kKeyBlock; ++j) s[t0 + j] = vhsum(acc[j]) * scale;
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

/// out[d0, d0 + (C - 1) * kW + last) = (sum_t e[t] * v_t[d]) * inv: C accumulators, each a
/// sequential FMA chain over t. C and whether the last vector is whole are compile-time, so the
/// accumulators stay in registers (a run-time count kept them on the stack) and whole vectors
/// need no masked load.
template <int C, bool kWholeLast>
static void weighted_value_chunks(const float* e, int64_t count, const float* prefix_v,
                                  const float* tree_v, const int32_t* tree_slots, int64_t prefix,
                                  int64_t stride, int64_t d0, int last, float inv, float* out) {
  vf acc[C];
  for (int c = 0; c < C; ++c) acc[c] = vzero();
  for (int64_t t = 0; t < count; ++t) {
    const float* v = visible_row(prefix_v, tree_v, tree_slots, prefix, stride, t) + d0;
    const vf p = vset1(e[t]);
    for (int c = 0; c + 1 < C; ++c) acc[c] = vfma(p, vload(v + c * kW), acc[c]);
    acc[C - 1] = vfma(p, kWholeLast ? vload(v + (C - 1) * kW) : vload_n(v + (C - 1) * kW, last),
                      acc[C - 1]);
  }
  const vf scale = vset1(inv);
  for (int c = 0; c + 1 < C; ++c) vstore(out + d0 + c * kW, vmul(acc[c], scale));
  if (kWholeLast)
    vstore(out + d0 + (C - 1) * kW, vmul(acc[C - 1], scale));
  else
    vstore_n(out + d0 + (C - 1) * kW, vmul(acc[C - 1], scale), last);
}

/// weighted_value_chunks<C, ...> for a run-time chunk count in [1, C].
template <int C>
static void weighted_value_chunks_any(int chunks, const float* e, int64_t count,
                                      const float* prefix_v, const float* tree_v,
                                      const int32_t* tree_slots, int64_t prefix, int64_t stride,
                                      int64_t d0, int last, float inv, float* out) {
  if (chunks == C) {
    if (last == kW)
      return weighted_value_chunks<C, true>(e, count, prefix_v, tree_v, tree_slots, prefix,
                                            stride, d0, last, inv, out);
    return weighted_value_chunks<C, false>(e, count, prefix_v, tree_v, tree_slots, prefix,
                                           stride, d0, last, inv, out);
  }
  if constexpr (C > 1)
    weighted_value_chunks_any<C - 1>(chunks, e, count, prefix_v, tree_v, tree_slots, prefix,
                                     stride, d0, last, inv, out);
}

/// out[d] = (sum_t e[t] * v_t[d]) * inv for the visible values; d in passes of <= 8 vectors.
static void weighted_values(const float* e, int64_t count, const float* prefix_v,
                            const float* tree_v, const int32_t* tree_slots, int64_t prefix,
                            int64_t stride, int64_t dim, float inv, float* out) {
  for (int64_t d0 = 0; d0 < dim; d0 += kValueChunks * kW) {
    const int64_t width = dim - d0 < kValueChunks * kW ? dim - d0 : kValueChunks * kW;
    const int chunks = static_cast<int>((width + kW - 1) / kW);
    const int last = static_cast<int>(width - (chunks - 1) * kW);
    weighted_value_chunks_any<kValueChunks>(chunks, e, count, prefix_v, tree_v, tree_slots,
                                            prefix, stride, d0, last, inv, out);
  }
}

/// One query head of one query node: its scores over the visible keys, softmax, values.
static void attention_task(const AttentionArgs& a, int64_t b, int64_t i, int64_t head,
                           float* s, int32_t* tree_slots) {
  const int64_t kvh = head / (a.q_heads / a.kv_heads), dim = a.head_dim;
  const int64_t stride = a.kv_heads * dim;  // between consecutive cache positions
  int64_t prefix = a.lens[b];
  prefix = prefix < 0 ? 0 : (prefix > a.max_len - a.tree_keys ? a.max_len - a.tree_keys : prefix);
  const int32_t* row = a.tree_mask + (b * a.queries + i) * a.words;
  int64_t visible_tree = 0;
  for (int64_t j = 0; j < a.tree_keys; ++j)
    if ((static_cast<uint32_t>(row[j / 32]) >> (j % 32)) & 1u) tree_slots[visible_tree++] = static_cast<int32_t>(j);
  const int64_t count = prefix + visible_tree;
  const int64_t base = b * a.max_len * stride + kvh * dim;
  const float* k_prefix = a.k_cache + base;
  const float* v_prefix = a.v_cache + base;
  const float* q = a.q + ((b * a.queries + i) * a.q_heads + head) * dim;
  float* out = a.out + ((b * a.queries + i) * a.q_heads + head) * dim;
  if (count == 0) {
    for (int64_t d = 0; d < dim; ++d) out[d] = 0.0f;
    return;
  }
  key_scores(q, k_prefix, k_prefix + prefix * stride, tree_slots, prefix, count, stride, dim,
             a.scale, s);
  const float total = softmax_weights(s, count);
  weighted_values(s, count, v_prefix, v_prefix + prefix * stride, tree_slots, prefix, stride, dim,
                  1.0f / total, out);
}

static void tree_attention(const AttentionArgs& a) {
  const int64_t per_thread = attention_workspace_floats(a.max_len, a.tree_keys);
  // One task per query head (not per KV head): a decode step has only kv_heads KV heads, too
  // few to share out evenly; the group's heads re-read the same keys from cache instead.
  const int64_t tasks = a.batch * a.queries * a.q_heads;
#pragma omp parallel num_threads(a.threads)
  {
    float* scores = a.workspace + omp_get_thread_num() * per_thread;
    int32_t* tree_slots = reinterpret_cast<int32_t*>(scores + attention_scores_floats(a.max_len));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t head = task % a.q_heads, i = (task / a.q_heads) % a.queries;
      attention_task(a, task / (a.q_heads * a.queries), i, head, scores, tree_slots);
    }
  }
}
