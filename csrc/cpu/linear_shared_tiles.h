/**
 * @file linear_shared_tiles.h
 * @brief How a GEMM's threads share its work (decoder_linear.h linear_packed runs it on a team
 *        of up to kMaxShareQueues). Included by decoder_linear.h inside an instruction-set
 *        namespace; nothing from the standard library (see simd.h).
 */

// Threads share pieces of work, not fixed ranges. A decode step's GEMM region is short (~10-50
// us a layer GEMM) and its two halves did not end together: over a decode step the thread that
// ended a one-row GEMM first waited 12-18 % of the region (either thread, as often: noise in
// memory, not one slower core; Intel VM, 2026-11-29), and a 2-row verify the same. So each
// thread's share (the panels thread_share gives it) is a queue of pieces, the units linear_panels
// runs anyway (one row: a row tile; more rows: a block, or kBlockMinPanels panels of row
// groups): its owner takes pieces from the front, a thread whose own queue is empty takes them
// from the back of another's. Which thread computes a piece never changes its bits (a column
// does not depend on the tile or block it is computed in, see decoder_linear.h), only when it
// ends. Measured in one process against the fixed shares (alternating rounds, same VM): a
// layer's four GEMMs over in-cache Q4 packs at 1 row 0.90 / 0.92x (108 against 118-121 us; 1.01x
// in a later quieter spell, 89 us), 2 / 4 rows 0.92-0.96x, 8-16 rows 0.95-1.01x, 32 / 64 rows
// 1.00x; the decode step 0.96-0.99x (DRAM-bound then, 6.5-7.9 ms), the lm_head from L3 and the
// draft head's one-row GEMMs unchanged (1.00 / 1.02x, within noise).

/// Thread t's share as a queue of its pieces [front, back), one word (front << 32 | back) so
/// that an owner's take and a thief's take cannot both get the last piece (a share of 2^32
/// pieces or more keeps its fixed range: linear_packed); a cache line each (taken with
/// __atomic builtins: no standard-library inline code, see simd.h).
struct alignas(64) ShareQueue {
  uint64_t range;
};
/// Teams up to this size share pieces (a queue each on the stack); larger teams keep their
/// fixed shares.
constexpr int kMaxShareQueues = 64;

/// Panels of one piece of m rows over a pack of WT: what linear_panels runs as one unit.
template <typename WT>
static int64_t piece_panels(int64_t m, int64_t k) {
  if (m == 1) return single_row_panels<WT>();
  if (in_row_groups<WT>(m)) return kBlockMinPanels;
  return panels_per_block<WT>(k, block_tile<WT>(m));
}

static int64_t piece_panels_of(PackFormat format, int64_t m, int64_t k) {
  switch (format) {
    case PackFormat::kQ4: return piece_panels<Q4Byte>(m, k);
    case PackFormat::kQ8: return piece_panels<Q8Byte>(m, k);
    case PackFormat::kBf16: return piece_panels<uint16_t>(m, k);
    default: return piece_panels<float>(m, k);
  }
}

/// Piece `index` of thread t's share: segment, first panel, panels (<= piece_panels).
struct Piece {
  int segment = -1;
  int64_t p = 0, panels = 0;
};

/// Pieces of thread t's share (the count) and its piece `index` (into `piece`, when given):
/// piece_panels of each segment part from the part's first panel, the last one short.
static int64_t share_pieces(const LinearArgs& a, int64_t t, int64_t threads, int64_t index,
                            Piece* piece) {
  int64_t count = 0;
  share_parts(a.num_segments, [&](int i) { return a.segments[i].n; }, t, threads,
              [&](int i, int64_t p0, int64_t p1) {
    const int64_t size = piece_panels_of(a.segments[i].w.format, a.m, a.k);
    const int64_t pieces = (p1 - p0 + size - 1) / size;
    if (piece != nullptr && index >= count && index < count + pieces) {
      const int64_t p = p0 + (index - count) * size;
      *piece = {i, p, p1 - p < size ? p1 - p : size};
    }
    count += pieces;
    return true;
  });
  return count;
}

/// Takes a piece from the front (owner) or the back (another thread) of `queue`: its index, or
/// -1 when none is left.
static int64_t take_piece(ShareQueue& queue, bool front) {
  uint64_t range = __atomic_load_n(&queue.range, __ATOMIC_RELAXED);
  for (;;) {
    const int64_t first = static_cast<int64_t>(range >> 32),
                  last = static_cast<int64_t>(range & 0xffffffffu);
    if (first >= last) return -1;
    const uint64_t taken = front ? range + (uint64_t{1} << 32) : range - 1;
    if (__atomic_compare_exchange_n(&queue.range, &range, taken, true, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED))
      return front ? first : last - 1;
  }
}

/// The lines of piece `index` of thread t's share (none when index < 0 or past the share's
/// end): what the piece before asks for, as the block before it did (one row: one tile).
static LineRange piece_lines(const LinearArgs& a, int64_t t, int64_t threads, int64_t index) {
  Piece piece;
  if (index < 0) return {nullptr, 0};
  share_pieces(a, t, threads, index, &piece);
  if (piece.segment < 0) return {nullptr, 0};
  const PackedWeight w = a.segments[piece.segment].w;
  const int64_t bytes = panel_bytes(w.format, a.k);
  return {static_cast<const char*>(w.data) + piece.p * bytes, piece.panels * bytes / 64};
}

/// linear_panels over one piece, asking for `then` during its last tile.
static void run_piece(const LinearArgs& a, TileRows x, const Piece& piece, LineRange then) {
  segment_panels(a, x, a.segments[piece.segment], piece.p, piece.p + piece.panels, then);
}

/// Thread t's part of a GEMM over `queues` (one per thread of `threads`, filled): its own
/// pieces front first, each asking for the next one (after its last: what a.then says it reads
/// first), then pieces from the backs of the others' queues, each asking for the one before.
static void shared_pieces(const LinearArgs& a, TileRows x, ShareQueue* queues, int64_t t,
                          int64_t threads) {
  Piece piece;
  for (int64_t index; (index = take_piece(queues[t], true)) >= 0;) {
    share_pieces(a, t, threads, index, &piece);
    const int64_t last =
        static_cast<int64_t>(__atomic_load_n(&queues[t].range, __ATOMIC_RELAXED) & 0xffffffffu);
    LineRange then = index + 1 < last ? piece_lines(a, t, threads, index + 1)
                                      : LineRange{nullptr, 0};
    if (then.from == nullptr && a.then.first != nullptr)
      then = a.then.first(a.then.what, t, threads);
    run_piece(a, x, piece, then);
  }
  for (int64_t step = 1; step < threads; ++step) {
    const int64_t victim = (t + step) % threads;
    for (int64_t index; (index = take_piece(queues[victim], false)) >= 0;) {
      share_pieces(a, victim, threads, index, &piece);
      run_piece(a, x, piece, piece_lines(a, victim, threads, index - 1));
    }
  }
}
