/**
 * @file acceptance.h
 * @brief greedy_accept_tree / greedy_accept_chain for the cpu backend
 *        (eagle_kernels/ops/acceptance.py): the target's argmax at every node, then the longest
 *        path whose draft tokens it agrees with. Contract: the reference's, exactly.
 *
 * Why a kernel: torch.argmax over a 49k vocabulary row costs ~100 us on a 2-core CPU (about
 * 2 GB/s over an L2-resident row), and the path logic another ~250 us of small ops: ~1.7 % of a
 * decode step and more of a verify cycle, for what two vector passes do in microseconds.
 */

/// torch.argmax of row[0, n): the first maximal entry; a NaN counts as the maximum (the first
/// NaN wins), as torch does.
static int64_t row_argmax(const float* row, int64_t n) {
  vf best = vset1(-__builtin_inff());
  unsigned nan_lanes = 0;
  int64_t v = 0;
  for (; v + kW <= n; v += kW) {
    const vf x = vload(row + v);
    nan_lanes |= vmask_not_le(x, x);  // x <= x fails only for NaN
    best = vmax(best, x);
  }
  float max = vhmax(best);
  bool nan = nan_lanes != 0;
  for (int64_t i = v; i < n; ++i) {
    nan = nan || row[i] != row[i];
    max = row[i] > max ? row[i] : max;
  }
  for (int64_t i = 0; i < n; ++i) {  // the first entry equal to the maximum (or NaN)
    if (nan ? row[i] != row[i] : row[i] == max) return i;
  }
  return 0;  // unreachable: some entry is the maximum
}

/// Whether `node` indexes one of the N tree nodes. As in the CUDA / Triton kernels
/// (acceptance.cuh is_node): an entry outside [0, N) ends a path and a row that does not start
/// at a node is padding, so paths the op refuses with checks on (and runs with checks off) read
/// nothing outside the tree, and every backend answers them alike.
static inline bool is_tree_node(int64_t node, int64_t nodes) { return node >= 0 && node < nodes; }

/// One tree: accepted length of every path row, the first longest, and its outputs; no row
/// that starts at a node: the root alone (0 accepted, its bonus token).
static void greedy_accept_one(const GreedyAcceptArgs& a, int64_t b) {
  const int64_t n = a.nodes, width = a.width;
  const int64_t* tokens = a.tokens + b * n;
  const int64_t* ids = a.target_ids + b * n;
  const int32_t* paths = a.paths + b * a.num_paths * width;
  static const int32_t kRootOnly[1] = {0};
  const int32_t* best = kRootOnly;
  int64_t best_len = -1;
  for (int64_t r = 0; r < a.num_paths; ++r) {
    const int32_t* path = paths + r * width;
    if (!is_tree_node(path[0], n)) continue;
    int64_t len = 0;
    while (len + 1 < width && is_tree_node(path[len + 1], n) &&
           tokens[path[len + 1]] == ids[path[len]])
      ++len;
    if (len > best_len) best_len = len, best = path;
  }
  const int64_t accepted = best_len < 0 ? 0 : best_len;
  int64_t* out = a.output_tokens + b * width;
  int32_t* nodes = a.accepted_nodes + b * width;
  for (int64_t j = 0; j < width; ++j) {
    nodes[j] = j <= accepted ? best[j] : -1;
    out[j] = j < accepted ? tokens[best[j + 1]] : -1;
  }
  out[accepted] = ids[best[accepted]];
  a.num_accepted[b] = static_cast<int32_t>(accepted);
}

static void greedy_accept(const GreedyAcceptArgs& a) {
  const int64_t rows = a.batch * a.nodes;
#pragma omp parallel for num_threads(a.threads) schedule(static) \
    if (rows > 1 && rows * a.vocab >= kParallelMinEntries)
  for (int64_t r = 0; r < rows; ++r) a.target_ids[r] = row_argmax(a.logits + r * a.vocab, a.vocab);
  for (int64_t b = 0; b < a.batch; ++b) greedy_accept_one(a, b);
}

static bool is_stop_token(int64_t token, const int64_t* eos, int64_t num_eos) {
  for (int64_t e = 0; e < num_eos; ++e)
    if (token == eos[e]) return true;
  return false;
}

static inline int64_t clamp_count(int64_t count, int64_t low, int64_t high) {
  return count < low ? low : count > high ? high : count;
}

/// The decode loop's bookkeeping for every row (RecordArgs, kernels.h); the same result as
/// the torch version in generation.py for valid input.
static void record_tokens(const RecordArgs& a) {
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t* tokens = a.new_tokens + b * a.width;
    const int64_t offered = a.counts != nullptr ? a.counts[b] : 1;
    int64_t count = a.done[b] ? 0 : clamp_count(offered, 0, a.width);
    bool hit_eos = false;
    for (int64_t j = 0; j < count; ++j) {
      if (is_stop_token(tokens[j], a.eos, a.num_eos)) {
        count = j + 1, hit_eos = true;
        break;
      }
    }
    const int64_t start = clamp_count(a.generated[b], 0, a.out_width);
    count = clamp_count(count, 0, a.budgets[b] - a.generated[b]);
    count = clamp_count(count, 0, a.out_width - start);
    for (int64_t j = 0; j < count; ++j) a.out[b * a.out_width + start + j] = tokens[j];
    a.generated[b] += count;
    a.done[b] = a.done[b] || hit_eos || a.generated[b] >= a.budgets[b];
    a.recorded[b] = count;
  }
}

/// The greedy autoregressive step's choice and bookkeeping (GreedyStepArgs, kernels.h).
static void greedy_step(const GreedyStepArgs& a) {
  for (int64_t b = 0; b < a.record.batch; ++b) {
    a.active[b] = a.record.done[b] ? 0 : 1;
    a.lens[b] += static_cast<int32_t>(a.active[b]);
    a.root[b] = row_argmax(a.logits + b * a.vocab, a.vocab);
  }
  record_tokens(a.record);
}
