/**
 * @file tree.h
 * @brief build_tree and eagle2_rerank for the cpu backend (eagle_kernels/ops/tree.py): the
 *        end of every drafting step on CPU, one tree per OpenMP iteration.
 *
 * Why a kernel: the torch reference walks nodes in Python (one indexing op per node, a
 * nonzero per leaf), about 0.5-1 ms per small tree on a 2-core CPU, where this takes
 * microseconds. Contracts as csrc/tree.cuh (the CUDA kernels): the same outputs as the
 * reference for valid input; a kept candidate whose parent was not kept gets parent -1 (the
 * Python op turns it into the reference's ValueError); invalid parents (outside [0, node)) end
 * an ancestor walk as if at the root, so no access leaves its tree's rows whatever the input.
 */

/// Parent of `node` if stepping to it is valid (0 <= parent < node), else -1 (as a root).
static inline int64_t checked_parent(const int32_t* parents, int64_t node) {
  if (node <= 0) return -1;
  const int64_t parent = parents[node];
  return parent >= 0 && parent < node ? parent : -1;
}

/// Depth, packed ancestor mask rows and root-to-leaf paths of one tree of n nodes.
/// `has_child` is an [n] workspace.
static void build_one_tree(const int32_t* parents, int64_t n, int64_t words, int64_t width,
                           int32_t* depth, int32_t* mask, int32_t* paths, uint8_t* has_child) {
  for (int64_t i = 0; i < n; ++i) has_child[i] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t parent = checked_parent(parents, i);
    depth[i] = parent < 0 ? 0 : depth[parent] + 1;  // parents come first: already set
    if (parent >= 0) has_child[parent] = 1;
    // Ancestors have decreasing indices: fill the row's words from the last one down.
    int32_t* row = mask + i * words;
    int64_t cur = i;
    for (int64_t word = words - 1; word >= 0; --word) {
      uint32_t bits = 0;
      for (; cur >= 0 && cur / 32 == word; cur = checked_parent(parents, cur))
        bits |= 1u << (cur % 32);
      row[word] = static_cast<int32_t>(bits);
    }
  }
  int64_t leaf_row = 0;
  for (int64_t leaf = 0; leaf < n; ++leaf) {
    if (has_child[leaf]) continue;
    int32_t* row = paths + leaf_row++ * width;
    for (int64_t j = depth[leaf] + 1; j < width; ++j) row[j] = -1;
    int64_t cur = leaf;
    for (int64_t j = depth[leaf]; j >= 0 && cur >= 0; --j, cur = checked_parent(parents, cur))
      if (j < width) row[j] = static_cast<int32_t>(cur);  // deeper than width: dropped
  }
  for (int64_t i = leaf_row * width; i < n * width; ++i) paths[i] = -1;
}

static void build_tree(const BuildTreeArgs& a) {
#pragma omp parallel for num_threads(a.threads) schedule(static) \
    if (a.batch * a.nodes * a.width >= kParallelMinEntries)
  for (int64_t b = 0; b < a.batch; ++b) {
    build_one_tree(a.parents + b * a.nodes, a.nodes, a.words, a.width, a.depth + b * a.nodes,
                   a.tree_mask + b * a.nodes * a.words, a.paths + b * a.nodes * a.width,
                   a.workspace + b * a.nodes);
  }
}

/// Position of `value` in the ascending sorted[0, n), or -1.
static int64_t find_sorted(const int64_t* sorted, int64_t n, int64_t value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sorted[mid] < value) lo = mid + 1; else hi = mid;
  }
  return lo < n && sorted[lo] == value ? lo : -1;
}

/// One tree: the best N - 1 candidates (select_top's order: score, then lower index), in
/// candidate order as nodes 1..N-1, then the tree built from their parents.
static void rerank_one_tree(const RerankArgs& a, int64_t b) {
  const int64_t m = a.candidates, n = a.nodes, keep = n - 1;
  const float* cand_scores = a.cand_scores + b * m;
  const int32_t* cand_parents = a.cand_parents + b * m;
  int64_t* selected = a.selected + b * keep;
  float* scores = a.scores + b * n;
  int32_t* parents = a.parents + b * n;
  int64_t* tokens = a.tokens + b * n;
  if (keep > 0) select_top(cand_scores, m, keep, scores + 1, selected);
  for (int64_t i = 1; i < keep; ++i) {  // ascending candidate index = topological order
    const int64_t value = selected[i];
    int64_t j = i;
    for (; j > 0 && selected[j - 1] > value; --j) selected[j] = selected[j - 1];
    selected[j] = value;
  }
  tokens[0] = a.root_tokens[b];
  parents[0] = -1;
  scores[0] = 0.0f;
  for (int64_t node = 1; node < n; ++node) {
    const int64_t candidate = selected[node - 1];
    const int64_t parent = cand_parents[candidate];
    // A parent at or after its child is invalid input: treated like a parent not kept.
    const int64_t parent_pos =
        parent < 0 || parent >= candidate ? -1 : find_sorted(selected, keep, parent);
    parents[node] = parent < 0 ? 0 : static_cast<int32_t>(parent_pos < 0 ? -1 : parent_pos + 1);
    tokens[node] = a.cand_tokens[b * m + candidate];
    scores[node] = cand_scores[candidate];
  }
  build_one_tree(parents, n, a.words, a.width, a.depth + b * n, a.tree_mask + b * n * a.words,
                 a.paths + b * n * a.width, a.workspace + b * n);
}

static void eagle2_rerank(const RerankArgs& a) {
#pragma omp parallel for num_threads(a.threads) schedule(static) \
    if (a.batch * a.candidates >= kParallelMinEntries)
  for (int64_t b = 0; b < a.batch; ++b) rerank_one_tree(a, b);
}
