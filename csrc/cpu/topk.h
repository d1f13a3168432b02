/**
 * @file topk.h
 * @brief topk_log_softmax and eagle2_expand for the cpu backend (eagle_kernels/ops/topk.py):
 *        the drafting step's top-k over vocabulary rows and its frontier pick, OpenMP over rows.
 *
 * Why a kernel: the torch reference composes the exact tie rule from log_softmax, topk, two
 * compares, a cumsum, nonzero and two sorts, about 0.6 ms per call on a 2-core CPU for a few
 * rows of an 8k draft vocabulary: more than the head's lm_head GEMM it follows. One pass here
 * selects the k best (a vector compare against the current k-th best skips almost every entry)
 * and a second sums e^(x - max) for the log-softmax.
 *
 * Order (the reference's, exactly): descending by value, equal values by lowest index, -0.0
 * equal to 0.0, NaN above everything (torch's descending sort). Entries are scanned in index
 * order and a new entry must rank strictly above the current k-th to enter, so among equal
 * values the earlier index always stays ahead.
 */

/// Whether a ranks strictly above b in the order of the file comment.
static inline bool ranks_above(float a, float b) {
  if (a != a) return b == b;  // NaN above every number, equal to another NaN
  return a > b;               // false when b is NaN; -0.0 > 0.0 is false
}

/// The k best of row[0, n) (1 <= k <= n, k <= kSelectMaxK: an insert shifts up to k entries)
/// into best_value / best_index [k], best first.
static void select_top(const float* row, int64_t n, int64_t k, float* best_value,
                       int64_t* best_index) {
  int64_t count = 0;
  auto insert = [&](float x, int64_t i) {  // x ranks above best_value[k - 1] or count < k
    int64_t j = count < k ? count++ : k - 1;
    for (; j > 0 && ranks_above(x, best_value[j - 1]); --j) {
      best_value[j] = best_value[j - 1];
      best_index[j] = best_index[j - 1];
    }
    best_value[j] = x;
    best_index[j] = i;
  };
  int64_t v = 0;
  for (; v < k; ++v) insert(row[v], v);
  for (; v + kW <= n; v += kW) {
    // Lanes that may enter: above the k-th best, or unordered (NaN on either side).
    unsigned lanes = vmask_not_le(vload(row + v), vset1(best_value[k - 1]));
    for (; lanes != 0; lanes &= lanes - 1) {
      const int64_t i = v + __builtin_ctz(lanes);
      if (ranks_above(row[i], best_value[k - 1])) insert(row[i], i);
    }
  }
  for (; v < n; ++v)
    if (ranks_above(row[v], best_value[k - 1])) insert(row[v], v);
}

/// sum_v e^(row[v] - max) in two levels (per block of kTopkBlock, then across blocks), so a
/// 150k vocabulary's rounding stays below the reference's.
static float row_exp_sum(const float* row, int64_t n, float max) {
  const vf shift = vset1(max);
  vf total = vzero();
  for (int64_t v0 = 0; v0 < n; v0 += kTopkBlock) {
    const int64_t v1 = v0 + kTopkBlock < n ? v0 + kTopkBlock : n;
    vf block = vzero();
    for (int64_t v = v0; v < v1; v += kW) {
      const int lanes = v1 - v < kW ? static_cast<int>(v1 - v) : kW;
      block = vadd(block, vexp(vsub(lanes == kW ? vload(row + v)
                                                : load_or_minus_inf(row + v, lanes), shift)));
    }
    total = vadd(total, block);
  }
  return vhsum(total);
}

static void topk_log_softmax_row(const TopkArgs& a, int64_t r) {
  const float* row = a.logits + r * a.vocab;
  float* values = a.values + r * a.k;
  int64_t* ids = a.ids + r * a.k;
  select_top(row, a.vocab, a.k, values, ids);
  // The best entry is the row's maximum. A row with a NaN or a +inf, or with only -inf, has a
  // NaN log-softmax everywhere (as torch.log_softmax); no exponential is taken of it.
  const float max = values[0];
  const bool undefined = max != max || max == -__builtin_inff() || max == __builtin_inff();
  const float log_sum = undefined ? 0.0f : __builtin_logf(row_exp_sum(row, a.vocab, max));
  for (int64_t j = 0; j < a.k; ++j) {
    values[j] = undefined ? __builtin_nanf("") : (values[j] - max) - log_sum;
    if (a.d2t != nullptr) ids[j] += a.d2t[ids[j]];
  }
}

static void topk_log_softmax(const TopkArgs& a) {
#pragma omp parallel for num_threads(a.threads) schedule(static) \
    if (a.rows * a.vocab >= kParallelMinEntries)
  for (int64_t r = 0; r < a.rows; ++r) topk_log_softmax_row(a, r);
}

/// candidate_scores[b, f * C + c] = frontier[b, f] + child[b, f, c] (one fp32 add, as torch),
/// then the top_k best of each tree's candidates.
static void eagle2_expand(const ExpandArgs& a) {
  const int64_t candidates = a.frontier * a.children;
#pragma omp parallel for num_threads(a.threads) schedule(static) \
    if (a.batch * candidates >= kParallelMinEntries)
  for (int64_t b = 0; b < a.batch; ++b) {
    float* scores = a.candidate_scores + b * candidates;
    for (int64_t f = 0; f < a.frontier; ++f) {
      const float base = a.frontier_scores[b * a.frontier + f];
      const float* child = a.child_log_probs + (b * a.frontier + f) * a.children;
      for (int64_t c = 0; c < a.children; ++c) scores[f * a.children + c] = base + child[c];
    }
    select_top(scores, candidates, a.top_k, a.next_scores + b * a.top_k,
               a.next_index + b * a.top_k);
  }
}
