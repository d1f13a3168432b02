/**
 * @file kv.h
 * @brief CPU KV-cache compaction after acceptance (contract: eagle_kernels.ops.reference.
 *        compact_kv). Included inside an instruction-set namespace after simd.h.
 *
 * Per sequence b with L = lens[b] and n = min(num_accepted[b] + 1, width), row L + nodes[b, j]
 * of every cache moves to row L + j for j = 1 .. n - 1, in increasing j. Path nodes increase
 * along a path (node j >= j), so every row is read before a move overwrites it: the result of
 * the reference's gather-then-scatter. Rows already in place (nodes[b, j] == j: a chain of
 * first children) are not touched, so most decode cycles copy nothing.
 *
 * Bounds: a move whose node is negative or whose source or target row falls outside
 * [0, max_len) is skipped, so no input reaches outside the caches (value checks off included).
 */

static void compact_kv(const CompactKvArgs& a) {
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t prefix = a.lens[b];
    const int64_t accepted = static_cast<int64_t>(a.num_accepted[b]) + 1;
    const int64_t count = accepted < a.width ? accepted : a.width;
    for (int64_t j = 1; j < count; ++j) {
      const int64_t node = a.nodes[b * a.width + j];
      const int64_t from = prefix + node, to = prefix + j;
      if (node == j || node < 0 || prefix < 0 || from >= a.max_len || to >= a.max_len) continue;
      for (int64_t c = 0; c < a.num_caches; ++c) {
        const int64_t row = a.row_bytes[c];
        char* rows = reinterpret_cast<char*>(a.caches[c]) + b * a.max_len * row;
        __builtin_memmove(rows + to * row, rows + from * row, static_cast<unsigned long>(row));
      }
    }
  }
}
