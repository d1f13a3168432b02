/**
 * @file attention.h
 * @brief CPU tree attention (contract: eagle_kernels.ops.reference.tree_attention, fp32).
 *        Included inside an instruction-set namespace after simd.h.
 *
 * One task = one query node of one sequence and one KV head: its `group` query heads share the
 * keys. A query's visible keys, in position order, are the prefix [0, L) and then its tree
 * ancestors (set bits of its mask row) by increasing tree index: an ancestor always has a
 * smaller index than its descendants, so index order is depth order is position order. Over
 * that list, for each head:
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

/// out[d] = (sum_t e[t] * v_t[d]) * inv for the visible values; d in chunks of <= 8 vectors.
static void weighted_values(const float* e, int64_t count, const float* prefix_v,
                            const float* tree_v, const int32_t* tree_slots, int64_t prefix,
                            int64_t stride, int64_t dim, float inv, float* out) {
  constexpr int kChunks = 8;
  for (int64_t d0 = 0; d0 < dim; d0 += kChunks * kW) {
    const int64_t width = dim - d0 < kChunks * kW ? dim - d0 : kChunks * kW;
    const int chunks = static_cast<int>((width + kW - 1) / kW);
    const int last = static_cast<int>(width - (chunks - 1) * kW);
    vf acc[kChunks];
    for (int c = 0; c < kChunks; ++c) acc[c] = vzero();
    for (int64_t t = 0; t < count; ++t) {
      const float* v = (t < prefix ? prefix_v + t * stride
                                   : tree_v + static_cast<int64_t>(tree_slots[t - prefix]) * stride) + d0;
      const vf p = vset1(e[t]);
      for (int c = 0; c + 1 < chunks; ++c) acc[c] = vfma(p, vload(v + c * kW), acc[c]);
      acc[chunks - 1] = vfma(p, vload_n(v + (chunks - 1) * kW, last), acc[chunks - 1]);
    }
    const vf scale = vset1(inv);
    for (int c = 0; c + 1 < chunks; ++c) vstore(out + d0 + c * kW, vmul(acc[c], scale));
    vstore_n(out + d0 + (chunks - 1) * kW, vmul(acc[chunks - 1], scale), last);
  }
}

static void attention_task(const AttentionArgs& a, int64_t b, int64_t i, int64_t kvh,
                           float* scores, int32_t* tree_slots) {
  const int64_t group = a.q_heads / a.kv_heads, dim = a.head_dim;
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
  const float* k_tree = k_prefix + prefix * stride;
  const float* v_tree = v_prefix + prefix * stride;
  const int64_t padded = (a.max_len + 16) / 16 * 16;
  for (int64_t g = 0; g < group; ++g) {
    const int64_t head = kvh * group + g;
    const float* q = a.q + ((b * a.queries + i) * a.q_heads + head) * dim;
    float* out = a.out + ((b * a.queries + i) * a.q_heads + head) * dim;
    if (count == 0) {
      for (int64_t d = 0; d < dim; ++d) out[d] = 0.0f;
      continue;
    }
    float* s = scores + g * padded;
    for (int64_t t = 0; t < prefix; ++t) s[t] = dot(q, k_prefix + t * stride, dim) * a.scale;
    for (int64_t t = 0; t < visible_tree; ++t)
      s[prefix + t] = dot(q, k_tree + static_cast<int64_t>(tree_slots[t]) * stride, dim) * a.scale;
    const float total = softmax_weights(s, count);
    weighted_values(s, count, v_prefix, v_tree, tree_slots, prefix, stride, dim, 1.0f / total, out);
  }
}

static void tree_attention(const AttentionArgs& a) {
  const int64_t group = a.q_heads / a.kv_heads;
  const int64_t per_thread = attention_workspace_floats(group, a.max_len, a.tree_keys);
  const int64_t tasks = a.batch * a.queries * a.kv_heads;
#pragma omp parallel num_threads(a.threads)
  {
    float* scores = a.workspace + omp_get_thread_num() * per_thread;
    int32_t* tree_slots = reinterpret_cast<int32_t*>(scores + group * ((a.max_len + 16) / 16 * 16));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t kvh = task % a.kv_heads, i = (task / a.kv_heads) % a.queries;
      attention_task(a, task / (a.kv_heads * a.queries), i, kvh, scores, tree_slots);
    }
  }
}
