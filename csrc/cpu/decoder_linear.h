/**
 * @file decoder_linear.h
 * @brief The CPU GEMM of a decoder layer (ops.linear / linear_group, contract in
 *        eagle_kernels/ops/decoder.py and reference.py's linear) over prepacked weights: fp32,
 *        bf16, and GGUF Q4_1 / Q8_0 block packs. Included inside an instruction-set namespace
 *        after simd.h.
 *
 * Every output row is computed by code independent of the row count and of the thread count
 * (see kernels.h): that is the row-invariance the lossless runtime relies on.
 */

// ------------------------------------------------------------------------------------ linear
//
// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) over prepacked weights: w's rows in panels of
// kPanel = 16 columns, [ceil(N / 16), K, 16] (zero-padded; eagle_kernels/ops/decoder.py packs
// them once per weight, in bf16 when every weight is exactly a bf16 value (widened exactly: the
// fp32 pack's bits), in 4-bit Q4_1 or 8-bit Q8_0 blocks when every weight is exactly one: fewer
// bytes to stream; see "block packs" below). Each output y[m, n] lives in one vector lane: a
// sequential FMA chain over each chunk of kChunk k's (acc = fma(x[m, k], w[n, k], acc)), the
// chunks added in order, then + bias (a block pack: a chain per block of kQ4BlockK k's over the
// block's integer levels, each block's sum scaled once): no horizontal sums, so the value does
// not depend on the tile shape, the row count, the thread count, nor even the instruction set
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
                                                  // spilled an accumulator (measured before
                                                  // block packs; not since)
constexpr int kFewRows = 12;                      // a row group: one 12x1 tile
constexpr int kLevelsRowTile = 4, kLevelsPanelTile = 3;  // widened block packs: 12 level sums
                                                  // and 12 running totals in registers
                                                  // (6 x 4 spills them: within noise, 16 /
                                                  // 64 rows)
constexpr int kNarrowRowGroupsMaxRows = 48;       // block packs (their levels cost 1.5 ops
                                                  // a 16-weight vector): row groups against
                                                  // widened blocks, in-process, 30 layers' Q4
                                                  // GEMMs: 24 / 32 / 48 rows 0.93 / 1.01 /
                                                  // 0.95x, the Q8 lm_head 32 / 48 / 64 rows
                                                  // 0.92 / 0.97 / 1.03x
constexpr int kRowGroupsMaxRows = 12, kNarrowRowGroupsFrom = kRowTile + 1;  // Zen 5, Q4 packs:
                                                  // 8 / 12 rows -25 / -10 % against widened
                                                  // blocks, 16-24 the same, 64 +10 %
#elif defined(EK_ISA_AVX2)
constexpr int kRowTile = 3, kPanelTile = 2;       // 12 accumulators of 16 registers, two
                                                  // panel streams (used by M <= 2, fp32 M = 3
                                                  // and M > kRowGroupsMaxRows)
constexpr int kFewRows = 6;                       // a row group: one 6x1 tile (12 accumulators)
constexpr int kRowGroupsMaxRows = 64, kNarrowRowGroupsMaxRows = kRowGroupsMaxRows;
constexpr int kNarrowRowGroupsFrom = 3;           // a narrow pack's 3x2 tile spills: widening
                                                  // needs registers beside its 12 accumulators
constexpr int kNarrowPanelTile = kPanelTile;
constexpr int kLevelsRowTile = kRowTile, kLevelsPanelTile = kPanelTile;
#else
constexpr int kRowTile = 2, kPanelTile = 1;       // 8 four-lane accumulators
constexpr int kNarrowPanelTile = kPanelTile;
constexpr int kFewRows = kRowTile;
constexpr int kLevelsRowTile = kRowTile, kLevelsPanelTile = kPanelTile;
constexpr int kRowGroupsMaxRows = kFewRows, kNarrowRowGroupsFrom = kRowTile + 1;
constexpr int kNarrowRowGroupsMaxRows = kRowGroupsMaxRows;
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

// Block packs. Q4 packs (kernels.h PackFormat::kQ4): each panel is k / kQ4BlockK blocks of
// kQ4BlockBytes: d[16] and o[16] in fp32 (fp16 d, o = m + kQ4ZeroLevel d exact), then kQ4BlockK
// / 2 row pairs of 16 bytes, byte j holding column j's q of the pair's even row in its low
// nibble and of its odd row in its high nibble (simd.h vq4_level_pair). Q8 packs
// (PackFormat::kQ8): k / kQ4BlockK blocks of kQ8BlockBytes: d[16] in fp32, then 32 rows of 16
// int8 q. A weight is d L + o with the level L = q - kQ4ZeroLevel (Q4; -8..7), or d L with L =
// q (Q8), exactly the GGUF dequantized value (the packer checks that d q + m needs no rounding
// in fp32). The GEMM sums each block in its levels, exact small integers, and scales the sum
// once:
//   S = fma chain over the block's 32 k of x[m, k] * L[n, k] (from 0, k in order),
//   X = x[m, k0] + x[m, k0 + 1] + ... + x[m, k0 + 31] (in order; one per row and block),
//   T = fma(d, S, fma(o, X, T)) (Q4) or fma(d, S, T) (Q8), T from 0 over the blocks in order;
//   y = T (+ bias).
// So 16 Q4 weights cost the AVX-512 GEMV 1.5 vector ops beside their FMA, where rebuilding
// d q + m exactly took three (see vq4_level_pair). Every ISA forms L, S, X and T alike: every
// ISA, tile shape and row count gives the same bits. Not the fp32 pack's bits (which round each
// x * w), but as accurate: L centred on 0 keeps d S and o X from cancelling each other's
// digits. (An infinite x meeting a level 0, or a block with d = 0, gives NaN where an fp32
// pack gives inf: 0 * inf.)
constexpr int64_t kQ4BlockBytes = 2 * kPanel * 4 + kQ4BlockK * kPanel / 2;
constexpr int64_t kQ8BlockBytes = kPanel * 4 + kQ4BlockK * kPanel;

/// Q4 / Q8 packs' units of pointer arithmetic (one byte).
struct Q4Byte {
  uint8_t bits;
};
struct Q8Byte {
  int8_t bits;
};

/// A block pack's panels widened for the many-row GEMM (linear_panels): per block the pack's
/// own scales (kScaleFloats<WT> fp32), then kQ4BlockK rows of kPanel levels in fp32.
template <typename WT>
struct Levels {
  float value;
};
static_assert(sizeof(Levels<float>) == 4, "Levels is one float");

/// Narrow packs (Q4 / Q8) hold k in blocks of kQ4BlockK rows, each with its scales.
template <typename WT>
constexpr bool kBlockPacked = std::is_same_v<WT, Q4Byte> || std::is_same_v<WT, Q8Byte>;
/// What a narrow pack is widened to for the many-row GEMM: bf16 -> fp32, a block pack -> Levels.
template <typename WT>
using Widened = std::conditional_t<kBlockPacked<WT>, Levels<WT>, float>;
/// Block packs, narrow or widened to Levels: their GEMM sums each block on its own.
template <typename WT>
constexpr bool kBlockSummed =
    kBlockPacked<WT> || std::is_same_v<WT, Levels<Q4Byte>> || std::is_same_v<WT, Levels<Q8Byte>>;
/// Fp32 values of a block's scales: d[16] and o[16] (Q4), d[16] (Q8).
template <typename WT>
constexpr int64_t kScaleFloats =
    std::is_same_v<WT, Q4Byte> || std::is_same_v<WT, Levels<Q4Byte>> ? 2 * kPanel : kPanel;

/// Elements of WT per panel over k (fp32 / bf16: k x 16 values; q4 / q8: bytes, k % 32 == 0;
/// Levels: floats).
template <typename WT>
constexpr int64_t panel_size(int64_t k) {
  if constexpr (std::is_same_v<WT, Q4Byte>) return k / kQ4BlockK * kQ4BlockBytes;
  if constexpr (std::is_same_v<WT, Q8Byte>) return k / kQ4BlockK * kQ8BlockBytes;
  if constexpr (std::is_same_v<WT, Levels<Q4Byte>> || std::is_same_v<WT, Levels<Q8Byte>>)
    return k / kQ4BlockK * (kScaleFloats<WT> + kQ4BlockK * kPanel);
  return k * kPanel;
}

// A tile walks k in runs, each set up once: a narrow pack's runs are its blocks (the block's
// address and scales found once, not for every k: the one-row GEMM is compute-bound on
// turning narrow weights into fp32, and computing the address per k cost it 12 %), an fp32 /
// bf16 pack's a
// whole chunk. Run<WT>(panel, r0) starts at row r0 (a multiple of kRunRows<WT>); load(r, v) is
// vector v of its row r as exact fp32 (a block pack's Run: see Run<Q4Byte>).
template <typename WT>
constexpr int64_t kRunRows = kBlockSummed<WT> ? kQ4BlockK : kChunk;
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
/// Vector v of a tile's running total after a block: fma(d, S, fma(o, X, T)) for Q4 blocks,
/// fma(d, S, T) for Q8 (see "block packs"), from the block's scales (kScaleFloats<WT> fp32 at
/// `scales`).
template <typename WT>
EK_INLINE vf add_block(const float* scales, vf total, vf level_sum, int v, vf x_sum) {
  const vf d = vload(scales + v * kW);
  if constexpr (kScaleFloats<WT> == 2 * kPanel)
    return vfma(d, level_sum, vfma(vload(scales + kPanel + v * kW), x_sum, total));
  else
    return vfma(d, level_sum, total);
}

// A block pack's Run: load(r, v) is vector v of row r's levels in exact fp32 (a Q4 pack's:
// load_pair(r, v, even, odd), rows r and r + 1, r even); add(...) is add_block.
template <>
struct Run<Q4Byte> {  // d [16], o [16] (fp32), then 16 row pairs of 16 bytes
  const float* scales;
  const uint8_t* pairs;
  Run() = default;
  EK_INLINE Run(const Q4Byte* panel, int64_t r0) {
    // Not panel + panel_size<Q4Byte>(r0), the same value: written so (here and in Run<Q8Byte>),
    // GCC 12's code for the row groups ran 2x slower (7-12 rows, Zen 5: 3.0 -> 5.9 ms over 60
    // layer weights; the verify of 8 nodes 8.1 -> 16 ms). Time the row groups after touching.
    const Q4Byte* block = panel + r0 / kQ4BlockK * kQ4BlockBytes;
    scales = reinterpret_cast<const float*>(block);
    pairs = &block[2 * kPanel * 4].bits;
  }
  EK_INLINE void load_pair(int64_t r, int v, vf* even, vf* odd) const {
    vq4_level_pair(pairs + r / 2 * kPanel, v, even, odd);
  }
  EK_INLINE vf add(vf total, vf level_sum, int v, vf x_sum) const {
    return add_block<Q4Byte>(scales, total, level_sum, v, x_sum);
  }
};
template <>
struct Run<Q8Byte> {  // d [16] (fp32), then 32 rows of 16 int8 q
  const float* scales;
  const int8_t* rows;
  Run() = default;
  EK_INLINE Run(const Q8Byte* panel, int64_t r0) {
    const Q8Byte* block = panel + r0 / kQ4BlockK * kQ8BlockBytes;
    scales = reinterpret_cast<const float*>(block);
    rows = &block[kPanel * 4].bits;
  }
  EK_INLINE vf load(int64_t r, int v) const { return vload_q8(rows + r * kPanel + v * kW); }
  EK_INLINE vf add(vf total, vf level_sum, int v, vf x_sum) const {
    return add_block<Q8Byte>(scales, total, level_sum, v, x_sum);
  }
};
template <typename WT>
struct Run<Levels<WT>> {  // a block pack widened: its scales, then 32 rows of 16 fp32 levels
  const float* scales;
  const float* rows;
  Run() = default;
  EK_INLINE Run(const Levels<WT>* panel, int64_t r0) {
    scales = &panel[r0 / kQ4BlockK * (kScaleFloats<WT> + kQ4BlockK * kPanel)].value;
    rows = scales + kScaleFloats<WT>;
  }
  EK_INLINE vf load(int64_t r, int v) const { return vload(rows + r * kPanel + v * kW); }
  EK_INLINE vf add(vf total, vf level_sum, int v, vf x_sum) const {
    return add_block<WT>(scales, total, level_sum, v, x_sum);
  }
};

/// A GEMM's rows as a tile reads them: x [rows, k] (row stride ldx) and, for block packs, the
/// rows' block sums ([rows, k / kQ4BlockK] at `sums`, see block_sums; else nullptr).
struct TileRows {
  const float* x;
  int64_t ldx;
  const float* sums;
  int64_t blocks;  ///< k / kQ4BlockK: the row stride of sums
  EK_INLINE TileRows from(int64_t row) const {
    return {x + row * ldx, ldx, sums != nullptr ? sums + row * blocks : nullptr, blocks};
  }
};

/// y[i, col] for the tile's MR x V accumulated vectors at `total` (+ bias), `cols` valid columns.
template <int MR, int V>
EK_INLINE void store_tile(const float* total, const float* bias, float* y, int64_t ldy,
                          int64_t cols) {
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

/// The next `per_k` prefetches of a tile (see Prefetch), clamped at its last line.
struct PrefetchCursor {
  const char* at;
  const char* last;
  int64_t per_k;
  explicit PrefetchCursor(Prefetch ahead)
      : at(ahead.from), last(ahead.lines > 0 ? ahead.from + (ahead.lines - 1) * 64 : ahead.from),
        per_k(ahead.lines > 0 ? ahead.per_k : 0) {}
  EK_INLINE void step() {
    for (int64_t j = 0; j < per_k; ++j) {
      __builtin_prefetch(at, 0, 2);
      at = at + 64 < last ? at + 64 : last;
    }
  }
};

/// panel_tile over a block pack (see "block packs"): per block, one FMA chain per output over
/// the block's levels (two rows at a time: Q4 packs hold rows in pairs), then the block's
/// scaled sum added to the output's running total.
template <int MR, int J, typename WT>
static void panel_tile_blocks(TileRows x, const WT* panels, int64_t k, const float* bias,
                              float* y, int64_t ldy, int64_t cols, Prefetch ahead) {
  constexpr int V = J * kPanelVectors;
  const int64_t panel_stride = panel_size<WT>(k);
  vf total[MR][V];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < V; ++v) total[i][v] = vzero();
  PrefetchCursor fetch(ahead);
  for (int64_t r0 = 0; r0 < k; r0 += kQ4BlockK) {
    Run<WT> run[J];
    for (int j = 0; j < J; ++j) run[j] = Run<WT>(panels + j * panel_stride, r0);
    vf acc[MR][V];
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < V; ++v) acc[i][v] = vzero();
    if constexpr (std::is_same_v<WT, Q4Byte>) {
      for (int64_t r = 0; r < kQ4BlockK; r += 2) {
        fetch.step();
        fetch.step();
        vf even[V], odd[V];
        for (int j = 0; j < J; ++j)
          for (int v = 0; v < kPanelVectors; ++v)
            run[j].load_pair(r, v, &even[j * kPanelVectors + v], &odd[j * kPanelVectors + v]);
        for (int i = 0; i < MR; ++i) {
          const float* row = x.x + i * x.ldx + r0 + r;
          const vf x_even = vset1(row[0]), x_odd = vset1(row[1]);
          for (int v = 0; v < V; ++v)
            acc[i][v] = vfma(x_odd, odd[v], vfma(x_even, even[v], acc[i][v]));
        }
      }
    } else {  // one row at a time: Q8 and widened levels share no work between two rows,
              // and holding two rows' weights would double a tile's live registers
      for (int64_t r = 0; r < kQ4BlockK; ++r) {
        fetch.step();
        vf w[V];
        for (int j = 0; j < J; ++j)
          for (int v = 0; v < kPanelVectors; ++v) w[j * kPanelVectors + v] = run[j].load(r, v);
        for (int i = 0; i < MR; ++i) {
          const vf xv = vset1(x.x[i * x.ldx + r0 + r]);
          for (int v = 0; v < V; ++v) acc[i][v] = vfma(xv, w[v], acc[i][v]);
        }
      }
    }
    const int64_t block = r0 / kQ4BlockK;
    for (int i = 0; i < MR; ++i) {
      const vf x_sum = x.sums != nullptr ? vset1(x.sums[i * x.blocks + block]) : vzero();
      for (int v = 0; v < V; ++v)
        total[i][v] = run[v / kPanelVectors].add(total[i][v], acc[i][v], v % kPanelVectors, x_sum);
    }
  }
  alignas(64) float sums[MR * V * kW];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < V; ++v) vstore(sums + (i * V + v) * kW, total[i][v]);
  store_tile<MR, V>(sums, bias, y, ldy, cols);
}

/// Rows [0, MR) x panels [0, J) of y; `cols` valid columns from the first panel's first.
/// WT: the pack's element type (float, uint16_t holding bf16, Q4Byte, Q8Byte or Levels).
template <int MR, int J, typename WT>
static void panel_tile(TileRows x, const WT* panels, int64_t k, const float* bias, float* y,
                       int64_t ldy, int64_t cols, Prefetch ahead = {}) {
  if constexpr (kBlockSummed<WT>) {
    return panel_tile_blocks<MR, J>(x, panels, k, bias, y, ldy, cols, ahead);
  } else {
    constexpr int V = J * kPanelVectors;
    const int64_t panel_stride = panel_size<WT>(k);
    // Chunk sums go through memory (L1): keeping them in registers beside the accumulators
    // would spill the accumulators themselves.
    alignas(64) float total[MR * V * kW];
    for (int i = 0; i < MR * V; ++i) vstore(total + i * kW, vzero());
    PrefetchCursor fetch(ahead);
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
          fetch.step();
          vf w[V];
          for (int j = 0; j < J; ++j)
            for (int v = 0; v < kPanelVectors; ++v) w[j * kPanelVectors + v] = run[j].load(r, v);
          for (int i = 0; i < MR; ++i) {
            const vf xv = vset1(x.x[i * x.ldx + r0 + r]);
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
    store_tile<MR, V>(total, bias, y, ldy, cols);
  }
}

/// panel_tile<MR, panels> for a run-time panel count in [1, J].
template <int MR, int J, typename WT>
static void panel_tile_panels(int panels, TileRows x, const WT* w, int64_t k, const float* bias,
                              float* y, int64_t ldy, int64_t cols, Prefetch ahead) {
  if (panels == J) return panel_tile<MR, J>(x, w, k, bias, y, ldy, cols, ahead);
  if constexpr (J > 1) panel_tile_panels<MR, J - 1>(panels, x, w, k, bias, y, ldy, cols, ahead);
}

/// panel_tile<rows, panels> for run-time counts in [1, MR] x [1, J].
template <int MR, int J, typename WT>
static void panel_tile_any(int rows, int panels, TileRows x, const WT* w, int64_t k,
                           const float* bias, float* y, int64_t ldy, int64_t cols,
                           Prefetch ahead) {
  if (rows == MR) return panel_tile_panels<MR, J>(panels, x, w, k, bias, y, ldy, cols, ahead);
  if constexpr (MR > 1) panel_tile_any<MR - 1, J>(rows, panels, x, w, k, bias, y, ldy, cols, ahead);
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

/// m == 1: panels per tile (each an FMA chain; the one-row GEMM is bound by the vector ops that
/// turn narrow weights into fp32 and by DRAM, not by FMA latency). Zen 5 VM, AVX-512, against 8
/// (3 alternating processes each), before block packs: Q4, a standalone 30-layer stack of
/// SmolLM2-shaped weights, 4 panels -8..-12 % (2 / 3 / 6 panels +15 / +2 / 0 %); Q8, the
/// 49152 x 576 lm_head from DRAM, 6 panels -4..-8 % (4 +7 %, 12 within noise). Block packs,
/// Zen 4 VM, in-process A/B against 4: Q4 6 panels +2..+8 %, 8 within noise: 4 kept. fp32 /
/// bf16 packs keep 8 (not measured since).
template <typename WT>
constexpr int single_row_panels() {
#if defined(EK_ISA_AVX512)
  if constexpr (std::is_same_v<WT, Q4Byte>) return 4;
  if constexpr (std::is_same_v<WT, Q8Byte>) return 6;
#endif
  return 8 / kPanelVectors;
}

/// Bytes of one panel over k of a pack of `format`.
static int64_t panel_bytes(PackFormat format, int64_t k) {
  switch (format) {
    case PackFormat::kQ4: return panel_size<Q4Byte>(k);
    case PackFormat::kQ8: return panel_size<Q8Byte>(k);
    case PackFormat::kBf16: return panel_size<uint16_t>(k) * 2;
    default: return panel_size<float>(k) * 4;
  }
}

/// single_row_panels of a pack of `format`.
static int single_row_panels_of(PackFormat format) {
  switch (format) {
    case PackFormat::kQ4: return single_row_panels<Q4Byte>();
    case PackFormat::kQ8: return single_row_panels<Q8Byte>();
    case PackFormat::kBf16: return single_row_panels<uint16_t>();
    default: return single_row_panels<float>();
  }
}

/// The lines of the first one-row tile over panels [p0, p1) of pack `w` over k (none if empty).
static LineRange first_tile(PackedWeight w, int64_t k, int64_t p0, int64_t p1) {
  if (p0 >= p1) return {nullptr, 0};
  const int64_t tile = single_row_panels_of(w.format), bytes = panel_bytes(w.format, k);
  const int64_t panels = p1 - p0 < tile ? p1 - p0 : tile;
  return {static_cast<const char*>(w.data) + p0 * bytes, panels * bytes / 64};
}

/// `lines` asked for over a tile's `steps` k steps (see Prefetch).
static Prefetch spread(LineRange lines, int64_t steps) {
  if (lines.lines <= 0 || steps <= 0) return {};
  return {lines.from, lines.lines, (lines.lines + steps - 1) / steps};
}

/// One row, panels [p0, p1) of a segment (pack `packed`): single_row_panels streams at a time,
/// each tile prefetching the next tile's panels over its k steps, and the last one `after` (the
/// first lines this thread reads next: its next piece of work, in this GEMM or the next; see
/// linear_shared_tiles.h: without it every share began by waiting on DRAM, the hardware
/// prefetcher not yet started). The hardware prefetcher
/// alone left DRAM idle on a Zen 5 VM: the decoder stack's decode step 6.1-6.5 -> 4.3-4.7 ms
/// with Q4 packs on AVX-512, 8.7 -> 5.8 ms on AVX2 (one process each way, alternating).
template <typename WT>
static void linear_single_row(const LinearArgs& a, TileRows x, const LinearSegment& s,
                              const WT* packed, int64_t p0, int64_t p1, LineRange then) {
  constexpr int kTile = single_row_panels<WT>();
  const Prefetch after = spread(then, a.k);
  for (int64_t p = p0; p < p1; p += kTile) {
    const int panels = static_cast<int>(p1 - p < kTile ? p1 - p : kTile);
    const int64_t col = p * kPanel;
    const WT* w = packed + p * panel_size<WT>(a.k);
    const float* bias = s.bias ? s.bias + col : nullptr;
    const Prefetch ahead = p + panels < p1 ? panels_ahead(packed, p + panels, kTile, p1, a.k)
                                           : after;
    if (panels == kTile) {
      panel_tile<1, kTile>(x, w, a.k, bias, s.y + col, s.ldy, s.n - col, ahead);
    } else {  // the tail, one tile: same chains (one panel at a time ran one latency-bound chain)
      panel_tile_panels<1, kTile>(panels, x, w, a.k, bias, s.y + col, s.ldy, s.n - col, ahead);
    }
  }
}

/// Every row, panels [p0, p1) of a segment, one panel at a time, in groups of at most kFewRows
/// rows (sizes differing by at most one) that each run one tile over the panel; the first group
/// prefetches the next panel, spread over its k steps (these tiles are FMA-heavy enough that
/// the hardware prefetcher alone lets DRAM idle), over the last panel `then` (the thread's next
/// share, see linear_single_row). See kRowGroupsMaxRows.
template <typename WT>
static void linear_row_groups(const LinearArgs& a, TileRows x, const LinearSegment& s,
                              const WT* packed, int64_t p0, int64_t p1, LineRange then) {
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
      else if (g == 0)  // the last panel: what the thread reads next
        ahead = spread(then, a.k);
      panel_tile_any<kFewRows, 1>(rows, 1, x.from(r), packed + p * panel_elements, a.k,
                                  s.bias ? s.bias + col : nullptr, s.y + r * s.ldy + col, s.ldy,
                                  s.n - col, ahead);
    }
  }
}

/// Panels per L2 block of the many-row path: kPanelBlockBytes of fp32 panels, or of Levels
/// (a narrow block is widened into a buffer of that size, see linear_widen_floats), at least
/// `tile` panels, a whole number of tiles.
template <typename WT>
static int64_t panels_per_block(int64_t k, int tile) {
  static_assert(kPanelTile <= kBlockMinPanels && kNarrowPanelTile <= kBlockMinPanels &&
                    kLevelsPanelTile <= kBlockMinPanels,
                "a block must fit the widening workspace");
  const int64_t panel_bytes = panel_size<Widened<WT>>(k) * 4;
  const int64_t block = panel_bytes > 0 ? kPanelBlockBytes / panel_bytes / tile * tile : 0;
  return block < tile ? tile : block;
}

/// Every row tile over panels [b0, b1), `tile` panels at a time, whose packs start at `panels`
/// (panel b0 first). The tile calls spread prefetches of the next block (`next_lines` 64-byte
/// lines from `next`) evenly among them, so DRAM keeps streaming while the FMA units work on
/// panels already in L2.
template <typename WT, int RowTile = kRowTile, int PanelTile = kPanelTile>
static void block_row_tiles(const LinearArgs& a, TileRows x, const LinearSegment& s,
                            const WT* panels, int64_t b0, int64_t b1, int tile, const char* next,
                            int64_t next_lines) {
  const int64_t panel_elements = panel_size<WT>(a.k);
  const int64_t row_tiles = (a.m + RowTile - 1) / RowTile;
  const int64_t calls = row_tiles * ((b1 - b0 + tile - 1) / tile);
  int64_t call = 0;
  for (int64_t r = 0; r < a.m; r += RowTile) {
    const int rows = static_cast<int>(a.m - r < RowTile ? a.m - r : RowTile);
    for (int64_t p = b0; p < b1; p += tile) {
      const int count = static_cast<int>(b1 - p < tile ? b1 - p : tile);
      const int64_t col = p * kPanel;
      Prefetch ahead;
      if (next_lines > 0 && calls > 0) {
        const int64_t first = next_lines * call / calls, last = next_lines * (call + 1) / calls;
        ahead = {next + first * 64, last - first, (last - first + a.k - 1) / a.k};
        ++call;
      }
      panel_tile_any<RowTile, PanelTile>(rows, count, x.from(r),
                                           panels + (p - b0) * panel_elements, a.k,
                                           s.bias ? s.bias + col : nullptr,
                                           s.y + r * s.ldy + col, s.ldy, s.n - col, ahead);
    }
  }
}

/// `panels` narrow panels over k, widened (bf16: the exact fp32 weights; a block pack: its
/// scales and its levels in fp32, exactly).
template <typename WT>
static void widen_panels(const WT* from, int64_t panels, int64_t k, Widened<WT>* to) {
  float* out = reinterpret_cast<float*>(to);  // Levels is one float
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t r0 = 0; r0 < k; r0 += kRunRows<WT>) {
      const Run<WT> run(from + p * panel_size<WT>(k), r0);
      const int64_t rows = k - r0 < kRunRows<WT> ? k - r0 : kRunRows<WT>;
      if constexpr (kBlockPacked<WT>)
        for (int64_t i = 0; i < kScaleFloats<WT>; ++i) *out++ = run.scales[i];
      if constexpr (std::is_same_v<WT, Q4Byte>) {
        for (int64_t r = 0; r < rows; r += 2)
          for (int v = 0; v < kPanelVectors; ++v) {
            vf even, odd;
            run.load_pair(r, v, &even, &odd);
            vstore(out + r * kPanel + v * kW, even);
            vstore(out + (r + 1) * kPanel + v * kW, odd);
          }
      } else {
        for (int64_t r = 0; r < rows; ++r)
          for (int v = 0; v < kPanelVectors; ++v) vstore(out + r * kPanel + v * kW, run.load(r, v));
      }
      out += rows * kPanel;
    }
}

/// sums[i, b] = x[i, 32 b] + x[i, 32 b + 1] + ... + x[i, 32 b + 31], added in that order (a
/// Q4 block's X, see "block packs"), for rows [0, m). The blocks' chains interleave, so the
/// adds' latency overlaps; each chain's order is fixed.
static void block_sums(const float* x, int64_t m, int64_t k, int64_t ldx, float* sums) {
  const int64_t blocks = k / kQ4BlockK;
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * ldx;
    float* out = sums + i * blocks;
    for (int64_t b = 0; b < blocks; ++b) out[b] = row[b * kQ4BlockK];
    for (int64_t r = 1; r < kQ4BlockK; ++r)
      for (int64_t b = 0; b < blocks; ++b) out[b] += row[b * kQ4BlockK + r];
  }
}

/// Whether linear_panels runs m > 1 rows over a pack of WT in row groups (kRowGroupsMaxRows).
template <typename WT>
static bool in_row_groups(int64_t m) {
  const int64_t from = std::is_same_v<WT, float> ? kRowTile + 1 : kNarrowRowGroupsFrom;
  return m >= from && m <= (kBlockPacked<WT> ? kNarrowRowGroupsMaxRows : kRowGroupsMaxRows);
}

/// Panels per row tile of linear_panels' blocks for m > 1 rows outside row groups: a full row
/// tile over a Q4 / Q8 pack (not widened: M <= kRowTile) takes kNarrowPanelTile.
template <typename WT>
static int block_tile(int64_t m) {
  return kBlockPacked<WT> && m == kRowTile ? kNarrowPanelTile
         : kBlockPacked<WT> && m > kRowTile ? kLevelsPanelTile : kPanelTile;
}

/// Every row, panels [p0, p1) of a segment: one row (linear_single_row), row groups (see
/// kRowGroupsMaxRows), else a block of panels at a time. Every tile of a block, the first one
/// included, prefetches a share of the next block, so DRAM streams while the FMA units work on
/// panels already in L2 (letting only the later tiles prefetch left the first one waiting on
/// DRAM: 8 rows -2 %, with 96 KB blocks -6 %, measured before row groups). One row tile
/// (M <= kRowTile) prefetches too: on a Zen 5 VM, Q4 packs, the decoder stack at 2-6 rows
/// 8-10.5 -> 4.5-6.5 ms on AVX-512 (on the Zen 4 VM before, fp32 packs: +5-7 %). The last
/// block prefetches `then` instead (the first one-row tile of the thread's next share). A narrow
/// block read by several row tiles is first widened into this thread's buffer (widening
/// in every tile cost ~25 % of these compute-bound GEMMs; row groups widen in every group,
/// and still measured faster).
template <typename WT>
static void linear_panels(const LinearArgs& a, TileRows x, const LinearSegment& s,
                          const WT* packed, int64_t p0, int64_t p1, LineRange then) {
  if (a.m == 1) return linear_single_row(a, x, s, packed, p0, p1, then);
  if (in_row_groups<WT>(a.m)) return linear_row_groups(a, x, s, packed, p0, p1, then);
  const int tile = block_tile<WT>(a.m);
  const int64_t block = panels_per_block<WT>(a.k, tile), panel_elements = panel_size<WT>(a.k);
  for (int64_t b0 = p0; b0 < p1; b0 += block) {
    const int64_t b1 = b0 + block < p1 ? b0 + block : p1;
    const int64_t n1 = b1 + block < p1 ? b1 + block : p1;  // the next block: [b1, n1)
    int64_t next_lines = (n1 - b1) * panel_elements * static_cast<int64_t>(sizeof(WT)) / 64;
    const char* next = reinterpret_cast<const char*>(packed + b1 * panel_elements);
    if (b1 == p1) {  // the last block: what the thread reads next (see linear_single_row)
      next = then.from;
      next_lines = then.lines;
    }
    if constexpr (!std::is_same_v<WT, float>) {
      if (a.m > kRowTile) {  // several row tiles read this block: widen it once
        auto* widened = reinterpret_cast<Widened<WT>*>(
            a.widened + omp_get_thread_num() * linear_workspace_floats(a.k, a.m));
        widen_panels(packed + b0 * panel_elements, b1 - b0, a.k, widened);
        if constexpr (kBlockPacked<WT>)
          block_row_tiles<Widened<WT>, kLevelsRowTile, kLevelsPanelTile>(a, x, s, widened, b0, b1,
                                                                         tile, next, next_lines);
        else
          block_row_tiles<Widened<WT>>(a, x, s, widened, b0, b1, tile, next, next_lines);
        continue;
      }
    }
    block_row_tiles<WT>(a, x, s, packed + b0 * panel_elements, b0, b1, tile, next, next_lines);
  }
}

/// Thread t's share [begin, end) (of `threads`) of a GEMM's `total` panels, all segments end
/// to end: threads split the panels, never the reduction.
struct Share {
  int64_t begin, end;
};
static Share thread_share(int64_t total, int64_t t, int64_t threads) {
  return {total * t / threads, total * (t + 1) / threads};
}

/// part(i, p0, p1) for each segment i of `count` (width_of(i) columns each, end to end) that
/// has panels [p0, p1) in `share`, in segment order; stops when part returns false.
template <typename Width, typename Part>
static void share_parts(int count, const Width& width_of, int64_t t, int64_t threads,
                        const Part& part) {
  int64_t total = 0;
  for (int i = 0; i < count; ++i) total += (width_of(i) + kPanel - 1) / kPanel;
  const Share share = thread_share(total, t, threads);
  int64_t offset = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t panels = (width_of(i) + kPanel - 1) / kPanel;
    const int64_t p0 = share.begin > offset ? share.begin - offset : 0;
    const int64_t p1 = share.end - offset < panels ? share.end - offset : panels;
    if (p0 < p1 && !part(i, p0, p1)) return;
    offset += panels;
  }
}

/// LookAhead::first of a GemmAhead: the first one-row tile of thread t's share (of `threads`)
/// of its GEMM.
static LineRange gemm_first_tile(const void* what, int64_t t, int64_t threads) {
  const GemmAhead& g = *static_cast<const GemmAhead*>(what);
  LineRange first{nullptr, 0};
  share_parts(g.count, [&](int i) { return g.n[i]; }, t, threads,
              [&](int i, int64_t p0, int64_t p1) {
    first = first_tile(g.w[i], g.k, p0, p1);
    return false;
  });
  return first;
}

/// panels(segment, p0, p1, then) for each segment's part of thread t's share of a GEMM; with
/// kLookAhead `then` is the first tile of the thread's next part, after the last what `a.then`
/// says the thread reads first next (without, or where nothing follows: none).
template <bool kLookAhead, typename Panels>
static void for_each_segment_share(const LinearArgs& a, int64_t t, int64_t threads,
                                   const Panels& panels_of) {
  int pending = -1;  // the part found last runs once the next one (its look-ahead) is known
  int64_t q0 = 0, q1 = 0;
  share_parts(a.num_segments, [&](int i) { return a.segments[i].n; }, t, threads,
              [&](int i, int64_t p0, int64_t p1) {
    if (pending >= 0)
      panels_of(a.segments[pending], q0, q1,
                kLookAhead ? first_tile(a.segments[i].w, a.k, p0, p1) : LineRange{nullptr, 0});
    pending = i;
    q0 = p0;
    q1 = p1;
    return true;
  });
  if (pending < 0) return;
  const bool then = kLookAhead && a.then.first != nullptr;
  panels_of(a.segments[pending], q0, q1,
            then ? a.then.first(a.then.what, t, threads) : LineRange{nullptr, 0});
}

/// linear_panels over panels [p0, p1) of segment s, whatever its pack's format.
static void segment_panels(const LinearArgs& a, TileRows x, const LinearSegment& s, int64_t p0,
                           int64_t p1, LineRange then) {
  if (s.w.format == PackFormat::kBf16)
    linear_panels(a, x, s, static_cast<const uint16_t*>(s.w.data), p0, p1, then);
  else if (s.w.format == PackFormat::kQ4)
    linear_panels(a, x, s, static_cast<const Q4Byte*>(s.w.data), p0, p1, then);
  else if (s.w.format == PackFormat::kQ8)
    linear_panels(a, x, s, static_cast<const Q8Byte*>(s.w.data), p0, p1, then);
  else
    linear_panels(a, x, s, static_cast<const float*>(s.w.data), p0, p1, then);
}

#include "linear_shared_tiles.h"  // how threads share a GEMM's pieces

/// The GEMM over every pack format (linear_int8.h's `linear` calls it).
static void linear_packed(const LinearArgs& a) {
  int64_t columns = 0;
  bool offsets = false;  // a Q4 pack: its blocks' offsets need the rows' block sums
  for (int i = 0; i < a.num_segments; ++i) {
    columns += a.segments[i].n;
    offsets = offsets || a.segments[i].w.format == PackFormat::kQ4;
  }
  const bool parallel = a.threads > 1 && a.m * a.k * columns >= kParallelMinMacs;
  ShareQueue queues[kMaxShareQueues];
  int64_t sharing = parallel && a.threads <= kMaxShareQueues ? a.threads : 0;
  // filled before the team starts (a thief may come first); a count past 32 bits (~2^36
  // columns) keeps the fixed shares
  for (int64_t t = 0; t < sharing; ++t) {
    const int64_t pieces = share_pieces(a, t, a.threads, -1, nullptr);
    if (pieces > 0xffffffff) sharing = 0;
    else queues[t].range = static_cast<uint64_t>(pieces);
  }
#pragma omp parallel num_threads(a.threads) if (parallel)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    TileRows x{a.x, a.ldx, nullptr, a.k / kQ4BlockK};
    if (offsets) {  // each thread its own copy: no barrier, and a few adds per weight row
      float* sums = a.widened + t * linear_workspace_floats(a.k, a.m) + linear_widen_floats(a.k);
      block_sums(a.x, a.m, a.k, a.ldx, sums);
      x.sums = sums;
    }
    if (sharing > 0)  // (a smaller team than asked for takes the missing threads' pieces)
      shared_pieces(a, x, queues, t, sharing);
    else
      for_each_segment_share<true>(a, t, threads,
                                   [&](const LinearSegment& s, int64_t p0, int64_t p1,
                                       LineRange then) { segment_panels(a, x, s, p0, p1, then); });
  }
}
