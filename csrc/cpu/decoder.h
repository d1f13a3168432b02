/**
 * @file decoder.h
 * @brief CPU kernels of a decoder layer's per-token work: linear (GEMM), RMSNorm, SiLU * up,
 *        rotary embedding. Included inside an instruction-set namespace after simd.h.
 *
 * Contracts: eagle_kernels/ops/decoder.py (and reference.py's linear / rms_norm / silu_mul /
 * apply_rope). Every kernel computes each output row by code independent of the row count and
 * of the thread count (see kernels.h): that is the row-invariance the lossless runtime relies on.
 */

// ------------------------------------------------------------------------------------ linear
//
// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) over prepacked weights: w's rows in panels of
// kPanel = 16 columns, [ceil(N / 16), K, 16] (zero-padded; eagle_kernels/ops/decoder.py packs
// them once per weight, in bf16 when every weight is exactly a bf16 value, in 4-bit Q4_1 or
// 8-bit Q8_0 blocks when every weight is exactly one: fewer bytes to stream, rebuilt exactly, so
// the same bits as an fp32 pack; see kQ4BlockBytes). Each output y[m, n] lives in one
// vector lane: a sequential FMA chain over each chunk of kChunk k's (acc = fma(x[m, k], w[n, k],
// acc)), the chunks added in order, then + bias: no horizontal sums, so the value does not
// depend on the tile shape, the row count, the thread count, nor even the instruction set
// (every ISA runs the same chain of correctly rounded FMAs). A tile of MR rows x
// J panels keeps MR * J * (16 / kW) such chains in registers: per k, J panel loads and MR
// broadcasts feed MR * J * 16 / kW FMAs. Threads split the panels, never the reduction; with
// many rows, panels go in blocks that stay in L2 while every row tile passes over them.

constexpr int kPanel = 16;                        ///< columns per packed panel
// k per partial sum: an output is sum over chunks (in order) of an FMA chain over 64 k's, so its
// rounding error grows like K / 64 + 64 instead of K (torch's blocked GEMMs are about as
// accurate); fixed, so every row count, thread count and ISA still gives the same bits.
constexpr int kChunk = 64;
constexpr int kPanelVectors = kPanel / kW;        ///< vectors per panel row
#if defined(EK_ISA_AVX512)
constexpr int kRowTile = 6, kPanelTile = 4;       // 24 accumulators of 32 registers
constexpr int kNarrowPanelTile = 3;               // a 6-row tile over Q4 / Q8 packs: 4 panels
                                                  // spilled an accumulator beside the Q4
                                                  // rebuild's constants
constexpr int kFewRows = 12;                      // a row group: one 12x1 tile
constexpr int kRowGroupsMaxRows = 12, kNarrowRowGroupsFrom = kRowTile + 1;  // Zen 5, Q4 packs:
                                                  // 8 / 12 rows -25 / -10 % against widened
                                                  // blocks, 16-24 the same, 64 +10 %
#elif defined(EK_ISA_AVX2)
constexpr int kRowTile = 3, kPanelTile = 2;       // 12 accumulators of 16 registers, two
                                                  // panel streams (used by M <= 2, fp32 M = 3
                                                  // and M > kRowGroupsMaxRows)
constexpr int kFewRows = 6;                       // a row group: one 6x1 tile (12 accumulators)
constexpr int kRowGroupsMaxRows = 64;
constexpr int kNarrowRowGroupsFrom = 3;           // a narrow pack's 3x2 tile spills: widening
                                                  // needs registers beside its 12 accumulators
constexpr int kNarrowPanelTile = kPanelTile;
#else
constexpr int kRowTile = 2, kPanelTile = 1;       // 8 four-lane accumulators
constexpr int kNarrowPanelTile = kPanelTile;
constexpr int kFewRows = kRowTile;
constexpr int kRowGroupsMaxRows = kFewRows, kNarrowRowGroupsFrom = kRowTile + 1;
#endif
// Row groups: up to kRowGroupsMaxRows rows (from kNarrowRowGroupsFrom for a narrow pack, else from
// kRowTile + 1) go over one panel at a time, in groups of at most kFewRows rows that each run
// one tile over it: the first group reads the panel from DRAM while the next panel is
// prefetched, the others find it in L1 / L2. Measured on AVX2 (one process, alternating, bf16
// packs): 4-6 rows against 3 + 1 / 3 + 2 / 3 + 3 row tiles over L2 blocks -10..-16 % per
// decoder layer (DRAM-bound), and with weights in L3, where FMA work decides, 3 rows -18 %,
// 8-16 rows -15..-34 %, 24 rows -10 %, 32-64 rows -2..-5 %, 128 rows +2 % (so blocks beyond
// 64); the decoder stack at 256 keys of context (DRAM-bound) 3-8 rows the same, 12-24 rows
// -4..-6 %, 64 rows -3 %. fp32 packs: 3 rows +40..+80 % (their 3x2 tile does not spill: kept),
// 8-32 rows 0..-7 %.
// Below this many multiply-adds a GEMM runs on one thread: waking the team costs more.
constexpr int64_t kParallelMinMacs = 1 << 16;

/// Cache lines a tile asks the memory system for while it computes: `lines` 64-byte lines from
/// `from`, `per_k` of them per k step (see linear_panels). Never changes what is computed.
/// A tile issues exactly `per_k` prefetches per k step, the address clamped at the last line
/// once all are asked for (a branchy countdown per k cost the compute-bound one-row GEMM ~10 %
/// in L2 and the two-row GEMM 25-30 % from DRAM).
struct Prefetch {
  const char* from = nullptr;
  int64_t lines = 0, per_k = 0;
};

// Q4 packs (kernels.h PackFormat::kQ4): each panel is k / kQ4BlockK blocks of kQ4BlockBytes:
// a[16] and c[16] in fp32, a = kQ4LowScale d for columns 0-7 and kQ4HighScale d for 8-15, c =
// m - a (fp16 d and m; c exact, or the weight is not packed so), then kQ4BlockK rows of 8
// bytes, byte j holding row's q of column j in its low nibble and of column j + 8 in its high
// nibble. A weight is fma(d, q, m) = fma(a, 1 + q / scale, c): a * (1 + q / scale) = a + d q
// exactly, so the FMA's one rounding is the GGUF conversion's fl(d * q + m), the weight the
// fp32 pack would hold, bit for bit. AVX-512 builds 1 + q / scale from the nibble's bits alone
// (simd.h vq4_weights); the others use d = a / scale and m = a + c.
constexpr int64_t kQ4BlockK = 32;
constexpr int64_t kQ4BlockBytes = 2 * kPanel * 4 + kQ4BlockK * kPanel / 2;

// Q8 packs (PackFormat::kQ8): each panel is k / kQ4BlockK blocks of kQ8BlockBytes: d[16] in
// fp32, then 32 rows of 16 int8 q. A weight is d * q, exact in fp32 (11 bits times 8): the GGUF
// Q8_0 conversion's value.
constexpr int64_t kQ8BlockBytes = kPanel * 4 + kQ4BlockK * kPanel;

/// Q4 / Q8 packs' units of pointer arithmetic (one byte).
struct Q4Byte {
  uint8_t bits;
};
struct Q8Byte {
  int8_t bits;
};

/// Elements of WT per panel over k (fp32 / bf16: k x 16 values; q4 / q8: bytes, k % 32 == 0).
template <typename WT>
constexpr int64_t panel_size(int64_t k) {
  if constexpr (std::is_same_v<WT, Q4Byte>) return k / kQ4BlockK * kQ4BlockBytes;
  if constexpr (std::is_same_v<WT, Q8Byte>) return k / kQ4BlockK * kQ8BlockBytes;
  return k * kPanel;
}

/// Narrow packs (Q4 / Q8) hold k in blocks of kQ4BlockK rows, each with its scales.
template <typename WT>
constexpr bool kBlockPacked = std::is_same_v<WT, Q4Byte> || std::is_same_v<WT, Q8Byte>;

// A tile walks k in runs, each set up once: a narrow pack's runs are its blocks (the block's
// address and scales found once, not for every k: the one-row GEMM is compute-bound on
// rebuilding weights, and computing the address per k cost it 12 %), an fp32 / bf16 pack's a
// whole chunk. Run<WT>(panel, r0) starts at row r0 (a multiple of kRunRows<WT>); load(r, v) is
// vector v of its row r as exact fp32, whatever the pack's format.
template <typename WT>
constexpr int64_t kRunRows = kBlockPacked<WT> ? kQ4BlockK : kChunk;
static_assert(kChunk % kQ4BlockK == 0, "a chunk must hold whole blocks");

/// kW weights of an fp32 / bf16 pack, as exact fp32.
EK_INLINE vf load_wide(const float* p) { return vload(p); }
EK_INLINE vf load_wide(const uint16_t* p) { return vload_bf16(p); }

template <typename WT>  // fp32 / bf16 packs: rows of kPanel weights
struct Run {
  const WT* rows;
  Run() = default;
  EK_INLINE Run(const WT* panel, int64_t r0) : rows(panel + r0 * kPanel) {}
  EK_INLINE vf load(int64_t r, int v) const { return load_wide(rows + r * kPanel + v * kW); }
};
template <>
struct Run<Q4Byte> {  // a [16], c = m - a [16] (fp32), then 32 rows of 8 bytes
  const uint8_t* rows;
  Q4Scales scales[kPanelVectors];
  Run() = default;
  EK_INLINE Run(const Q4Byte* panel, int64_t r0) {
    // Not panel + panel_size<Q4Byte>(r0), the same value: written so (here and in Run<Q8Byte>),
    // GCC 12's code for the row groups ran 2x slower (7-12 rows, Zen 5: 3.0 -> 5.9 ms over 60
    // layer weights; the verify of 8 nodes 8.1 -> 16 ms). Time the row groups after touching.
    const Q4Byte* block = panel + r0 / kQ4BlockK * kQ4BlockBytes;
    const float* a = reinterpret_cast<const float*>(block);
    for (int v = 0; v < kPanelVectors; ++v)
      scales[v] = vq4_scales(a + v * kW, a + kPanel + v * kW, v);
    rows = &block[2 * kPanel * 4].bits;
  }
  EK_INLINE vf load(int64_t r, int v) const {
    return vq4_weights(scales[v], rows + r * (kPanel / 2), v);
  }
};
template <>
struct Run<Q8Byte> {  // d [16] (fp32), then 32 rows of 16 int8 q: a weight is d * q, exact
  const int8_t* rows;
  vf d[kPanelVectors];
  Run() = default;
  EK_INLINE Run(const Q8Byte* panel, int64_t r0) {
    const Q8Byte* block = panel + r0 / kQ4BlockK * kQ8BlockBytes;
    const float* d_bits = reinterpret_cast<const float*>(block);
    for (int v = 0; v < kPanelVectors; ++v) d[v] = vload(d_bits + v * kW);
    rows = &block[kPanel * 4].bits;
  }
  EK_INLINE vf load(int64_t r, int v) const {
    return vmul(d[v], vload_q8(rows + r * kPanel + v * kW));
  }
};

/// Rows [0, MR) x panels [0, J) of y; `cols` valid columns from the first panel's first.
/// WT: the pack's element type (float, uint16_t holding bf16, Q4Byte or Q8Byte).
template <int MR, int J, typename WT>
static void panel_tile(const float* x, int64_t ldx, const WT* panels, int64_t k,
                       const float* bias, float* y, int64_t ldy, int64_t cols,
                       Prefetch ahead = {}) {
  constexpr int V = J * kPanelVectors;
  const int64_t panel_stride = panel_size<WT>(k);
  // Chunk sums go through memory (L1): keeping them in registers beside the accumulators
  // would spill the accumulators themselves.
  alignas(64) float total[MR * V * kW];
  for (int i = 0; i < MR * V; ++i) vstore(total + i * kW, vzero());
  const int64_t prefetches = ahead.lines > 0 ? ahead.per_k : 0;
  const char* fetch = ahead.from;
  const char* const last_line = ahead.lines > 0 ? ahead.from + (ahead.lines - 1) * 64 : fetch;
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t k1 = k0 + kChunk < k ? k0 + kChunk : k;
    vf acc[MR][V];
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < V; ++v) acc[i][v] = vzero();
    for (int64_t r0 = k0; r0 < k1; r0 += kRunRows<WT>) {
      const int64_t rows = k1 - r0 < kRunRows<WT> ? k1 - r0 : kRunRows<WT>;
      Run<WT> run[J];
      for (int j = 0; j < J; ++j) run[j] = Run<WT>(panels + j * panel_stride, r0);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < prefetches; ++j) {
          __builtin_prefetch(fetch, 0, 2);
          fetch = fetch + 64 < last_line ? fetch + 64 : last_line;
        }
        vf w[V];
        for (int j = 0; j < J; ++j)
          for (int v = 0; v < kPanelVectors; ++v)
            w[j * kPanelVectors + v] = run[j].load(r, v);
        for (int i = 0; i < MR; ++i) {
          const vf xv = vset1(x[i * ldx + r0 + r]);
          for (int v = 0; v < V; ++v) acc[i][v] = vfma(xv, w[v], acc[i][v]);
        }
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < V; ++v) {
        float* t = total + (i * V + v) * kW;
        vstore(t, vadd(vload(t), acc[i][v]));
      }
  }
  for (int v = 0; v < V; ++v) {
    const int64_t col = static_cast<int64_t>(v) * kW;
    if (col >= cols) break;
    const int n = static_cast<int>(cols - col < kW ? cols - col : kW);
    const vf b = bias != nullptr ? vload_n(bias + col, n) : vzero();
    for (int i = 0; i < MR; ++i) {
      const vf sum = vload(total + (i * V + v) * kW);
      const vf value = bias != nullptr ? vadd(sum, b) : sum;
      vstore_n(y + i * ldy + col, value, n);
    }
  }
}

/// panel_tile<MR, panels> for a run-time panel count in [1, J].
template <int MR, int J, typename WT>
static void panel_tile_panels(int panels, const float* x, int64_t ldx, const WT* w, int64_t k,
                              const float* bias, float* y, int64_t ldy, int64_t cols,
                              Prefetch ahead) {
  if (panels == J) return panel_tile<MR, J>(x, ldx, w, k, bias, y, ldy, cols, ahead);
  if constexpr (J > 1)
    panel_tile_panels<MR, J - 1>(panels, x, ldx, w, k, bias, y, ldy, cols, ahead);
}

/// panel_tile<rows, panels> for run-time counts in [1, MR] x [1, J].
template <int MR, int J, typename WT>
static void panel_tile_any(int rows, int panels, const float* x, int64_t ldx, const WT* w,
                           int64_t k, const float* bias, float* y, int64_t ldy, int64_t cols,
                           Prefetch ahead) {
  if (rows == MR)
    return panel_tile_panels<MR, J>(panels, x, ldx, w, k, bias, y, ldy, cols, ahead);
  if constexpr (MR > 1)
    panel_tile_any<MR - 1, J>(rows, panels, x, ldx, w, k, bias, y, ldy, cols, ahead);
}

/// Prefetch of panels [p, min(p + count, p1)) of a pack, spread over a tile's k steps.
template <typename WT>
static Prefetch panels_ahead(const WT* packed, int64_t p, int64_t count, int64_t p1,
                             int64_t k) {
  const int64_t panels = p1 - p < count ? p1 - p : count;
  if (panels <= 0) return {};
  const int64_t lines = panels * panel_size<WT>(k) * static_cast<int64_t>(sizeof(WT)) / 64;
  return {reinterpret_cast<const char*>(packed + p * panel_size<WT>(k)), lines,
          (lines + k - 1) / k};
}

/// m == 1: panels per tile (each an FMA chain; the one-row GEMM is bound by rebuilding narrow
/// weights and by DRAM, not by FMA latency). Zen 5 VM, AVX-512, against 8 (3 alternating
/// processes each): Q4, a standalone 30-layer stack of SmolLM2-shaped weights, 4 panels with
/// whole-tile tails -8..-12 % (8 spilled 4 of their 16 scale vectors beside the
/// accumulators; 2 / 3 / 6 panels +15 / +2 / 0 %); Q8, the 49152 x 576 lm_head from DRAM, 6
/// panels -4..-8 % (4 +7 %, 12 within noise). fp32 / bf16 packs keep 8 (not measured since).
template <typename WT>
constexpr int single_row_panels() {
#if defined(EK_ISA_AVX512)
  if constexpr (std::is_same_v<WT, Q4Byte>) return 4;
  if constexpr (std::is_same_v<WT, Q8Byte>) return 6;
#endif
  return 8 / kPanelVectors;
}

/// One row, panels [p0, p1) of a segment (pack `packed`): single_row_panels streams at a time,
/// each tile prefetching the next tile's panels over its k steps. The hardware prefetcher alone
/// left DRAM idle on a Zen 5 VM: the decoder stack's decode step 6.1-6.5 -> 4.3-4.7 ms with
/// Q4 packs on AVX-512, 8.7 -> 5.8 ms on AVX2 (one process each way, alternating).
template <typename WT>
static void linear_single_row(const LinearArgs& a, const LinearSegment& s, const WT* packed,
                              int64_t p0, int64_t p1) {
  constexpr int kTile = single_row_panels<WT>();
  for (int64_t p = p0; p < p1; p += kTile) {
    const int panels = static_cast<int>(p1 - p < kTile ? p1 - p : kTile);
    const int64_t col = p * kPanel;
    const WT* w = packed + p * panel_size<WT>(a.k);
    const float* bias = s.bias ? s.bias + col : nullptr;
    if (panels == kTile) {
      panel_tile<1, kTile>(a.x, a.ldx, w, a.k, bias, s.y + col, s.ldy, s.n - col,
                           panels_ahead(packed, p + panels, kTile, p1, a.k));
    } else {  // the tail, one tile: same chains (one panel at a time ran one latency-bound chain)
      panel_tile_panels<1, kTile>(panels, a.x, a.ldx, w, a.k, bias, s.y + col, s.ldy, s.n - col,
                                  Prefetch{});
    }
  }
}

/// Every row, panels [p0, p1) of a segment, one panel at a time, in groups of at most kFewRows
/// rows (sizes differing by at most one) that each run one tile over the panel; the first group
/// prefetches the next panel, spread over its k steps (these tiles are FMA-heavy enough that
/// the hardware prefetcher alone lets DRAM idle). See kRowGroupsMaxRows.
template <typename WT>
static void linear_row_groups(const LinearArgs& a, const LinearSegment& s, const WT* packed,
                              int64_t p0, int64_t p1) {
  const int64_t groups = (a.m + kFewRows - 1) / kFewRows;
  const int64_t panel_elements = panel_size<WT>(a.k);
  const int64_t panel_lines = panel_elements * static_cast<int64_t>(sizeof(WT)) / 64;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t col = p * kPanel;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t r = a.m * g / groups;  // rows [r, a.m * (g + 1) / groups): <= kFewRows
      const int rows = static_cast<int>(a.m * (g + 1) / groups - r);
      Prefetch ahead;
      if (g == 0 && p + 1 < p1)
        ahead = {reinterpret_cast<const char*>(packed + (p + 1) * panel_elements), panel_lines,
                 (panel_lines + a.k - 1) / a.k};
      panel_tile_any<kFewRows, 1>(rows, 1, a.x + r * a.ldx, a.ldx, packed + p * panel_elements,
                                  a.k, s.bias ? s.bias + col : nullptr, s.y + r * s.ldy + col,
                                  s.ldy, s.n - col, ahead);
    }
  }
}

/// Panels per L2 block of the many-row path: kPanelBlockBytes of fp32 panels (a narrow block
/// is widened into a buffer of that size), at least `tile` panels, a whole number of tiles.
static int64_t panels_per_block(int64_t k, int tile) {
  static_assert(kPanelTile <= kBlockMinPanels && kNarrowPanelTile <= kBlockMinPanels,
                "a block must fit the widening workspace");
  const int64_t panel_bytes = k * kPanel * 4;
  const int64_t block = panel_bytes > 0 ? kPanelBlockBytes / panel_bytes / tile * tile : 0;
  return block < tile ? tile : block;
}

/// Every row tile over panels [b0, b1), `tile` panels at a time, whose packs start at `panels`
/// (panel b0 first). The tile calls spread prefetches of the next block (`next_lines` 64-byte
/// lines from `next`) evenly among them, so DRAM keeps streaming while the FMA units work on
/// panels already in L2.
template <typename WT>
static void block_row_tiles(const LinearArgs& a, const LinearSegment& s, const WT* panels,
                            int64_t b0, int64_t b1, int tile, const char* next,
                            int64_t next_lines) {
  const int64_t panel_elements = panel_size<WT>(a.k);
  const int64_t row_tiles = (a.m + kRowTile - 1) / kRowTile;
  const int64_t calls = row_tiles * ((b1 - b0 + tile - 1) / tile);
  int64_t call = 0;
  for (int64_t r = 0; r < a.m; r += kRowTile) {
    const int rows = static_cast<int>(a.m - r < kRowTile ? a.m - r : kRowTile);
    for (int64_t p = b0; p < b1; p += tile) {
      const int count = static_cast<int>(b1 - p < tile ? b1 - p : tile);
      const int64_t col = p * kPanel;
      Prefetch ahead;
      if (next_lines > 0 && calls > 0) {
        const int64_t first = next_lines * call / calls, last = next_lines * (call + 1) / calls;
        ahead = {next + first * 64, last - first, (last - first + a.k - 1) / a.k};
        ++call;
      }
      panel_tile_any<kRowTile, kPanelTile>(rows, count, a.x + r * a.ldx, a.ldx,
                                           panels + (p - b0) * panel_elements, a.k,
                                           s.bias ? s.bias + col : nullptr,
                                           s.y + r * s.ldy + col, s.ldy, s.n - col, ahead);
    }
  }
}

/// `panels` narrow panels over k, rebuilt exactly as fp32 panels.
template <typename WT>
static void widen_panels(const WT* from, int64_t panels, int64_t k, float* to) {
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t r0 = 0; r0 < k; r0 += kRunRows<WT>) {
      const Run<WT> run(from + p * panel_size<WT>(k), r0);
      const int64_t rows = k - r0 < kRunRows<WT> ? k - r0 : kRunRows<WT>;
      for (int64_t r = 0; r < rows; ++r)
        for (int v = 0; v < kPanelVectors; ++v)
          vstore(to + (p * k + r0 + r) * kPanel + v * kW, run.load(r, v));
    }
}

/// Every row, panels [p0, p1) of a segment: one row (linear_single_row), row groups (see
/// kRowGroupsMaxRows), else a block of panels at a time. Every tile of a block, the first one
/// included, prefetches a share of the next block, so DRAM streams while the FMA units work on
/// panels already in L2 (letting only the later tiles prefetch left the first one waiting on
/// DRAM: 8 rows -2 %, with 96 KB blocks -6 %, measured before row groups). One row tile
/// (M <= kRowTile) prefetches too: on a Zen 5 VM, Q4 packs, the decoder stack at 2-6 rows
/// 8-10.5 -> 4.5-6.5 ms on AVX-512 (on the Zen 4 VM before, fp32 packs: +5-7 %). A narrow
/// block read by several row tiles is first widened into this thread's fp32 buffer (widening
/// in every tile cost ~25 % of these compute-bound GEMMs; row groups widen in every group,
/// and still measured faster).
template <typename WT>
static void linear_panels(const LinearArgs& a, const LinearSegment& s, const WT* packed,
                          int64_t p0, int64_t p1) {
  if (a.m == 1) return linear_single_row(a, s, packed, p0, p1);
  const int64_t groups_from = std::is_same_v<WT, float> ? kRowTile + 1 : kNarrowRowGroupsFrom;
  if (a.m >= groups_from && a.m <= kRowGroupsMaxRows)
    return linear_row_groups(a, s, packed, p0, p1);
  // A full row tile over a Q4 / Q8 pack (not widened: M <= kRowTile) takes kNarrowPanelTile.
  const int tile = kBlockPacked<WT> && a.m == kRowTile ? kNarrowPanelTile : kPanelTile;
  const int64_t block = panels_per_block(a.k, tile), panel_elements = panel_size<WT>(a.k);
  for (int64_t b0 = p0; b0 < p1; b0 += block) {
    const int64_t b1 = b0 + block < p1 ? b0 + block : p1;
    const int64_t n1 = b1 + block < p1 ? b1 + block : p1;  // the next block: [b1, n1)
    const int64_t next_lines = (n1 - b1) * panel_elements * static_cast<int64_t>(sizeof(WT)) / 64;
    const char* next = reinterpret_cast<const char*>(packed + b1 * panel_elements);
    if constexpr (!std::is_same_v<WT, float>) {
      if (a.m > kRowTile) {  // several row tiles read this block: widen it once
        float* widened = a.widened + omp_get_thread_num() * linear_workspace_floats(a.k);
        widen_panels(packed + b0 * panel_elements, b1 - b0, a.k, widened);
        block_row_tiles<float>(a, s, widened, b0, b1, tile, next, next_lines);
        continue;
      }
    }
    block_row_tiles<WT>(a, s, packed + b0 * panel_elements, b0, b1, tile, next, next_lines);
  }
}

static void linear(const LinearArgs& a) {
  int64_t total = 0;  // panels of all segments end to end
  for (int i = 0; i < a.num_segments; ++i) total += (a.segments[i].n + kPanel - 1) / kPanel;
  int64_t columns = 0;
  for (int i = 0; i < a.num_segments; ++i) columns += a.segments[i].n;
#pragma omp parallel num_threads(a.threads) if (a.m * a.k * columns >= kParallelMinMacs)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = total * t / threads, end = total * (t + 1) / threads;
    int64_t offset = 0;
    for (int i = 0; i < a.num_segments; ++i) {
      const LinearSegment& s = a.segments[i];
      const int64_t panels = (s.n + kPanel - 1) / kPanel;
      const int64_t p0 = begin > offset ? begin - offset : 0;
      const int64_t p1 = end - offset < panels ? end - offset : panels;
      if (p0 < p1) {
        if (s.w.format == PackFormat::kBf16)
          linear_panels(a, s, static_cast<const uint16_t*>(s.w.data), p0, p1);
        else if (s.w.format == PackFormat::kQ4)
          linear_panels(a, s, static_cast<const Q4Byte*>(s.w.data), p0, p1);
        else if (s.w.format == PackFormat::kQ8)
          linear_panels(a, s, static_cast<const Q8Byte*>(s.w.data), p0, p1);
        else
          linear_panels(a, s, static_cast<const float*>(s.w.data), p0, p1);
      }
      offset += panels;
    }
  }
}

// ----------------------------------------------------------------------------------- RMSNorm
//
// y = (h * (1 / sqrt(mean(h^2) + eps))) * weight with h = x (+ residual), as transformers'
// LlamaRMSNorm in fp32. The sum of squares is one lane-wise FMA chain + vhsum per row.

static void rms_norm_row(const RmsNormArgs& a, int64_t row) {
  const float* x = a.x + row * a.ldx;
  float* y = a.y + row * a.ldy;
  const float* h = x;
  if (a.residual != nullptr) {  // h = x + residual, kept for the next residual connection
    float* sum = a.sum_out + row * a.ldy;
    const float* r = a.residual + row * a.ldx;
    int64_t i = 0;
    for (; i + kW <= a.n; i += kW) vstore(sum + i, vadd(vload(x + i), vload(r + i)));
    if (i < a.n) {
      const int rest = static_cast<int>(a.n - i);
      vstore_n(sum + i, vadd(vload_n(x + i, rest), vload_n(r + i, rest)), rest);
    }
    h = sum;
  }
  vf acc = vzero();
  int64_t i = 0;
  for (; i + kW <= a.n; i += kW) {
    const vf v = vload(h + i);
    acc = vfma(v, v, acc);
  }
  if (i < a.n) {
    const vf v = vload_n(h + i, static_cast<int>(a.n - i));
    acc = vfma(v, v, acc);
  }
  const float mean = vhsum(acc) / static_cast<float>(a.n);
  const vf inv = vset1(1.0f / __builtin_sqrtf(mean + a.eps));
  for (i = 0; i + kW <= a.n; i += kW) vstore(y + i, vmul(vmul(vload(h + i), inv), vload(a.weight + i)));
  if (i < a.n) {
    const int rest = static_cast<int>(a.n - i);
    vstore_n(y + i, vmul(vmul(vload_n(h + i, rest), inv), vload_n(a.weight + i, rest)), rest);
  }
}

static void rms_norm(const RmsNormArgs& a) {
#pragma omp parallel for num_threads(a.threads) schedule(static) if (a.rows * a.n >= 32768)
  for (int64_t row = 0; row < a.rows; ++row) rms_norm_row(a, row);
}

// ------------------------------------------------------------------------------ SiLU * up

EK_INLINE vf silu_times(vf g, vf u) {
  return vmul(vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g)))), u);
}

static void silu_mul(const SiluMulArgs& a) {
#pragma omp parallel for num_threads(a.threads) schedule(static) if (a.rows * a.n >= 32768)
  for (int64_t row = 0; row < a.rows; ++row) {
    const float* g = a.gate + row * a.ld_in;
    const float* u = a.up + row * a.ld_in;
    float* y = a.y + row * a.ld_out;
    int64_t i = 0;
    for (; i + kW <= a.n; i += kW) vstore(y + i, silu_times(vload(g + i), vload(u + i)));
    if (i < a.n) {
      const int rest = static_cast<int>(a.n - i);
      vstore_n(y + i, silu_times(vload_n(g + i, rest), vload_n(u + i, rest)), rest);
    }
  }
}

// --------------------------------------------------------------------------------- RoPE
//
// x * cos + rotate_half(x) * sin, each product rounded on its own (no FMA), exactly as the
// reference computes it: for d < D/2 the rotated lane is -x[d + D/2], above it x[d - D/2].

static void rope_head(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; i += kW) {
    const int n = static_cast<int>(half - i < kW ? half - i : kW);
    const vf lo = vload_n(x + i, n), hi = vload_n(x + half + i, n);
    const vf new_lo = vsub(vmul(lo, vload_n(cos + i, n)), vmul(hi, vload_n(sin + i, n)));
    const vf new_hi = vadd(vmul(hi, vload_n(cos + half + i, n)), vmul(lo, vload_n(sin + half + i, n)));
    vstore_n(x + i, new_lo, n);
    vstore_n(x + half + i, new_hi, n);
  }
}

static void rope(const RopeArgs& a) {
  const int64_t half = a.head_dim / 2;
#pragma omp parallel for num_threads(a.threads) schedule(static) if (a.rows * a.heads >= 512)
  for (int64_t row = 0; row < a.rows; ++row) {
    int64_t p = a.positions[row];
    p = p < 0 ? 0 : (p >= a.table_rows ? a.table_rows - 1 : p);  // in bounds whatever came
    for (int64_t h = 0; h < a.heads; ++h)
      rope_head(a.x + row * a.ldx + h * a.head_dim, a.cos + p * a.head_dim, a.sin + p * a.head_dim,
                half);
  }
}
