/**
 * @file linear_shared_tiles.h
 * @brief The one-row GEMM's work sharing between threads (decoder_linear.h linear_packed runs
 *        it for m == 1 on a team of up to kMaxRowTileQueues). Included by decoder_linear.h
 *        inside an instruction-set namespace; nothing from the standard library (see simd.h).
 */

// One row: threads share tiles, not fixed ranges. A one-row GEMM region is short (~10-50 us a
// layer GEMM) and its two halves did not end together: over a decode step the thread that ended
// first waited 12-18 % of the region (either thread, as often: noise in memory, not one slower
// core; Intel VM, 2026-11-29). So each thread's share (the panels thread_share gives it, in the
// tiles linear_single_row runs) is a queue: its owner takes tiles from the front, a thread whose
// own queue is empty takes them from the back of another's. Which thread computes a tile never
// changes its bits (a tile's columns do not depend on the tile, see decoder_linear.h), only
// when it ends. Measured in one process against the fixed shares (40 alternating rounds, same
// VM): a layer's four one-row GEMMs over in-cache Q4 packs 0.90 / 0.92x (108 against 118-121
// us), the decode step 0.96-0.99x (DRAM-bound then, 6.5-7.9 ms), the lm_head from L3 and the
// draft head's GEMMs unchanged (1.00 / 1.02x, within noise).

/// Thread t's share as a queue of its one-row tiles [front, back), one word (front << 32 |
/// back) so that an owner's take and a thief's take cannot both get the last tile; a cache
/// line each (taken with __atomic builtins: no standard-library inline code, see simd.h).
struct alignas(64) RowTileQueue {
  uint64_t range;
};
/// Teams up to this size share one-row tiles (a queue each on the stack); larger teams keep
/// their fixed shares.
constexpr int kMaxRowTileQueues = 64;

/// Tile `index` of thread t's share: segment, first panel, panels (<= single_row_panels).
struct RowTile {
  int segment = -1;
  int64_t p = 0, panels = 0;
};

/// Tiles of thread t's share (count) and its tile `index` (tile): linear_single_row's tiles,
/// kTile panels of each segment part from the part's first panel, the last one short.
static int64_t share_row_tiles(const LinearArgs& a, int64_t t, int64_t threads, int64_t index,
                               RowTile* tile) {
  int64_t count = 0;
  share_parts(a.num_segments, [&](int i) { return a.segments[i].n; }, t, threads,
              [&](int i, int64_t p0, int64_t p1) {
    const int64_t size = single_row_panels_of(a.segments[i].w.format);
    const int64_t tiles = (p1 - p0 + size - 1) / size;
    if (tile != nullptr && index >= count && index < count + tiles) {
      const int64_t p = p0 + (index - count) * size;
      *tile = {i, p, p1 - p < size ? p1 - p : size};
    }
    count += tiles;
    return true;
  });
  return count;
}

/// Takes a tile from the front (owner) or the back (another thread) of `queue`: its index, or
/// -1 when none is left.
static int64_t take_row_tile(RowTileQueue& queue, bool front) {
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

/// The lines of tile `index` of thread t's share (none when index < 0 or past its end).
static LineRange row_tile_lines(const LinearArgs& a, int64_t t, int64_t threads, int64_t index) {
  RowTile tile;
  if (index < 0) return {nullptr, 0};
  share_row_tiles(a, t, threads, index, &tile);
  if (tile.segment < 0) return {nullptr, 0};
  const PackedWeight w = a.segments[tile.segment].w;
  const int64_t bytes = panel_bytes(w.format, a.k);
  return {static_cast<const char*>(w.data) + tile.p * bytes, tile.panels * bytes / 64};
}

/// One one-row tile over panels [p, p + panels) of segment s, asking for `ahead` meanwhile.
template <typename WT>
static void row_tile(const LinearArgs& a, TileRows x, const LinearSegment& s, int64_t p,
                     int64_t panels, LineRange ahead) {
  constexpr int kTile = single_row_panels<WT>();
  const int64_t col = p * kPanel;
  const WT* w = static_cast<const WT*>(s.w.data) + p * panel_size<WT>(a.k);
  const float* bias = s.bias ? s.bias + col : nullptr;
  if (panels == kTile)
    panel_tile<1, kTile>(x, w, a.k, bias, s.y + col, s.ldy, s.n - col, spread(ahead, a.k));
  else
    panel_tile_panels<1, kTile>(static_cast<int>(panels), x, w, a.k, bias, s.y + col, s.ldy,
                                s.n - col, spread(ahead, a.k));
}

static void row_tile_of(const LinearArgs& a, TileRows x, const RowTile& tile, LineRange ahead) {
  const LinearSegment& s = a.segments[tile.segment];
  if (s.w.format == PackFormat::kBf16)
    row_tile<uint16_t>(a, x, s, tile.p, tile.panels, ahead);
  else if (s.w.format == PackFormat::kQ4)
    row_tile<Q4Byte>(a, x, s, tile.p, tile.panels, ahead);
  else if (s.w.format == PackFormat::kQ8)
    row_tile<Q8Byte>(a, x, s, tile.p, tile.panels, ahead);
  else
    row_tile<float>(a, x, s, tile.p, tile.panels, ahead);
}

/// Thread t's part of a one-row GEMM over `queues` (one per thread, filled): its own tiles
/// front first, each asking for the next one (after its last: what a.then says it reads
/// first), then tiles from the backs of the others' queues, each asking for the one before.
static void shared_row_tiles(const LinearArgs& a, TileRows x, RowTileQueue* queues, int64_t t,
                             int64_t threads) {
  RowTile tile;
  for (int64_t index; (index = take_row_tile(queues[t], true)) >= 0;) {
    share_row_tiles(a, t, threads, index, &tile);
    const int64_t last =
        static_cast<int64_t>(__atomic_load_n(&queues[t].range, __ATOMIC_RELAXED) & 0xffffffffu);
    LineRange ahead = index + 1 < last ? row_tile_lines(a, t, threads, index + 1)
                                       : LineRange{nullptr, 0};
    if (ahead.from == nullptr && a.then.first != nullptr)
      ahead = a.then.first(a.then.what, t, threads);
    row_tile_of(a, x, tile, ahead);
  }
  for (int64_t step = 1; step < threads; ++step) {
    const int64_t victim = (t + step) % threads;
    for (int64_t index; (index = take_row_tile(queues[victim], false)) >= 0;) {
      share_row_tiles(a, victim, threads, index, &tile);
      row_tile_of(a, x, tile, row_tile_lines(a, victim, threads, index - 1));
    }
  }
}
