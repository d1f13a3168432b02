/**
 * @file linear_int8.h
 * @brief The CPU GEMM over Q4 / Q8 block packs with quantized activations (opt-in:
 *        eagle_kernels.ops.set_cpu_activations("int8" | "int16"); contract in
 *        eagle_kernels/ops/decoder.py and reference.py's linear_quantized_activations), and
 *        `linear`, the GEMM entry point of every instruction set. Included inside an
 *        instruction-set namespace after decoder_linear.h.
 *
 * Why: a one-row GEMM over 4-bit weights spends ~5 vector ops per 32 weights turning them into
 * fp32 and multiplying (decoder_linear.h), more than DRAM needs to deliver them on 2 cores,
 * and a many-row GEMM runs at the fp32 FMA rate (16 multiply-adds an instruction). With x
 * rounded to integers per block of 32 k, one VNNI vpdpbusd multiplies 64 weight bytes by 4
 * bytes of x each and sums them exactly in int32 (64 multiply-adds): int8 x (GGUF's Q8_0 for
 * activations, as llama.cpp does) takes one per 4 k, int16 x two (its high byte, signed, and
 * its low byte, unsigned: q = 256 h + l), for 256x finer x at half int8's rate.
 *
 * The computation, per row, block b of 32 k and column n (every ISA, tile and row count alike;
 * Q = 127 for int8, 32767 for int16):
 *   a   = max |x[k]| over the block (exact); s = a / Q (fp32 division; NaN when the block
 *         holds a non-finite x, so the row's outputs become NaN, not silently finite)
 *   q_k = x[k] / s rounded to the nearest integer, ties to even (fp32 division), clamped to
 *         [-Q, Q] (only a subnormal s, short of digits, can reach past); 0 where s = 0
 *   S   = sum_k q_k L[n, k], X = sum_k q_k (exact integers; L as in "block packs")
 *   T   = fma(s, fma(d, float(S), o * float(X)), T)  (Q4)  or  fma(s, d * float(S), T)  (Q8),
 *         T from 0 over the blocks in order
 *   y   = T (+ bias).
 * Integer sums are exact in any order and the float steps are the same correctly rounded
 * operations everywhere (float(S) is exact but for int16 x over Q8 packs, where it rounds to
 * nearest), so every instruction set, tile shape, row count and thread count gives the same
 * bits: row-invariant, like every GEMM here. Relative to the exact product of the rounded x
 * (s q) with the weights, each term passes through at most B + 3 roundings (B blocks), each
 * also off by up to 2^-150 (times s for the inner ones) where its result is subnormal:
 * |y - (s q) w^T| <= gamma_(B + 3) sum_k |s q_k| (|d| |L_k| + |o|) + that (tests/
 * test_linear_int8.py). (The file and its names say int8: every product here is a vpdpbusd of
 * bytes; int16 x is two of them.)
 */

// ------------------------------------------------------------- quantized activations
constexpr int kInt8Levels = 127;     ///< |q| <= 127: symmetric, as GGUF's Q8_0
constexpr int kInt16Levels = 32767;  ///< |q| <= 32767

/// One thread's integer copy of the GEMM's rows x [m, k] (in its GEMM workspace, after the
/// block sums; kernels.h linear_workspace_floats). int8: high = q; int16: high = q >> 8
/// (floor, -128..127) and low = q & 255, so q = 256 high + low.
struct QuantizedRows {
  int8_t* high;          ///< [m, k] in k order
  uint8_t* low;          ///< [m, k] in k order (int16 only)
  int8_t* high_paired;   ///< [m, k] per group of 8 k: the 4 even k, then the 4 odd (Q4 VNNI)
  uint8_t* low_paired;   ///< the same for low
  float* scale;          ///< [m, k / 32] s per block
  int32_t* sum;          ///< [m, k / 32] X per block
  int32_t* high_sum;     ///< [m, k / 32] sum of high per block (Q8 packs' sign correction)
  int64_t k, blocks;
  bool wide;             ///< int16 activations
};

static QuantizedRows quantized_rows(float* workspace, int64_t m, int64_t k, bool wide) {
  const int64_t blocks = k / kQ4BlockK, bytes = m * k;
  auto* base = reinterpret_cast<uint8_t*>(workspace);
  float* scale = workspace + (4 * bytes + 3) / 4;
  auto* sums = reinterpret_cast<int32_t*>(scale + m * blocks);
  return {reinterpret_cast<int8_t*>(base), base + bytes,
          reinterpret_cast<int8_t*>(base + 2 * bytes), base + 3 * bytes,
          scale, sums, sums + m * blocks, k, blocks, wide};
}

/// Where block `slot` (row i, block b) of `rows` keeps its values: the offset of its first
/// byte in the [m, k] arrays.
struct BlockSlot {
  int64_t at, slot;
};

/// Row i, block b of x quantized (scalar: every ISA's reference; the AVX-512 path matches it).
static void quantize_block_scalar(const float* x, const QuantizedRows& rows, BlockSlot where) {
  float amax = 0.0f;
  bool finite = true;
  for (int r = 0; r < kQ4BlockK; ++r) {
    const float a = __builtin_fabsf(x[r]);
    finite = finite && a <= 3.4028234663852886e38f;  // false for inf and NaN
    amax = a > amax ? a : amax;
  }
  const float levels = static_cast<float>(rows.wide ? kInt16Levels : kInt8Levels);
  const float s = finite ? amax / levels : __builtin_nanf("");
  int32_t total = 0, high_total = 0;
  for (int r = 0; r < kQ4BlockK; ++r) {
    const float level = finite && s > 0.0f ? __builtin_rintf(x[r] / s) : 0.0f;
    // |x / s| <= Q (1 + 2^-22) for a normal s; a subnormal s has fewer digits: clamp
    const int32_t q =
        static_cast<int32_t>(level > levels ? levels : level < -levels ? -levels : level);
    const int32_t high = rows.wide ? q >> 8 : q;
    rows.high[where.at + r] = static_cast<int8_t>(high);
    rows.low[where.at + r] = static_cast<uint8_t>(q & 255);
    total += q;
    high_total += high;
  }
  rows.scale[where.slot] = s;
  rows.sum[where.slot] = total;
  rows.high_sum[where.slot] = high_total;
}

#if defined(EK_ISA_AVX512)
#define EK_VNNI __attribute__((target("avx512vnni,avx512vbmi")))
/// 32 int32 lanes (two vectors) as bytes at `to` and in the Q4 order at `paired`.
EK_VNNI static void store_bytes(__m512i first, __m512i second, uint8_t* to, uint8_t* paired) {
  const __m128i a = _mm512_cvtepi32_epi8(first), b = _mm512_cvtepi32_epi8(second);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(to), a);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(to + 16), b);
  // per 8 bytes: 0 2 4 6 1 3 5 7 (pshufb works within each 16-byte lane: two groups of 8)
  const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(paired), _mm_shuffle_epi8(a, order));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(paired + 16), _mm_shuffle_epi8(b, order));
}

/// The same block, vectorised (bit-identical: max is exact, the division correctly rounded,
/// vcvtps2dq rounds to nearest even like rintf in the default rounding mode), plus the Q4
/// order of its bytes.
EK_VNNI static void quantize_block_vnni(const float* x, const QuantizedRows& rows,
                                        BlockSlot where) {
  const __m512 first = _mm512_loadu_ps(x), second = _mm512_loadu_ps(x + 16);
  const __mmask16 bad =
      _mm512_fpclass_ps_mask(first, 0x99) | _mm512_fpclass_ps_mask(second, 0x99);
  const float amax =
      _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(first), _mm512_abs_ps(second)));
  const float levels = static_cast<float>(rows.wide ? kInt16Levels : kInt8Levels);
  const float scale = bad != 0 ? __builtin_nanf("") : amax / levels;
  const __m512 s = _mm512_set1_ps(scale);
  const bool zero = bad != 0 || !(scale > 0.0f);  // s = 0 also where a tiny amax underflows
  const __m512i top = _mm512_set1_epi32(static_cast<int32_t>(levels));
  const __m512i bottom = _mm512_set1_epi32(-static_cast<int32_t>(levels));
  const auto level = [&](__m512 v) {  // rounded, clamped as the scalar block (subnormal s)
    return _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_div_ps(v, s)), bottom),
                            top);
  };
  const __m512i q0 = zero ? _mm512_setzero_si512() : level(first);
  const __m512i q1 = zero ? _mm512_setzero_si512() : level(second);
  const __m512i h0 = rows.wide ? _mm512_srai_epi32(q0, 8) : q0;
  const __m512i h1 = rows.wide ? _mm512_srai_epi32(q1, 8) : q1;
  store_bytes(h0, h1, reinterpret_cast<uint8_t*>(rows.high + where.at),
              reinterpret_cast<uint8_t*>(rows.high_paired + where.at));
  if (rows.wide)  // the low bytes: vpmovdb keeps each lane's low 8 bits
    store_bytes(q0, q1, rows.low + where.at, rows.low_paired + where.at);
  rows.scale[where.slot] = _mm512_cvtss_f32(s);
  rows.sum[where.slot] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  rows.high_sum[where.slot] = _mm512_reduce_add_epi32(_mm512_add_epi32(h0, h1));
}
#endif

/// Rows [0, m) of x quantized into `rows` (every block; the Q4 order only with VNNI).
static void quantize_rows(const float* x, int64_t m, int64_t ldx, const QuantizedRows& rows,
                          bool vnni) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < rows.blocks; ++b) {
      const BlockSlot where{i * rows.k + b * kQ4BlockK, i * rows.blocks + b};
      const float* from = x + i * ldx + b * kQ4BlockK;
#if defined(EK_ISA_AVX512)
      if (vnni) {
        quantize_block_vnni(from, rows, where);
        continue;
      }
#endif
      (void)vnni;
      quantize_block_scalar(from, rows, where);
    }
}

/// Row `row`, one panel (16 columns) of a Q4 (kQ4) or Q8 pack over k: the formula above,
/// scalar. The instruction sets without VNNI + VBMI run this (slow: a fallback that keeps the
/// mode's bits, not a fast path).
template <bool kQ4>
static void int8_panel_scalar(const QuantizedRows& xq, int64_t row, const uint8_t* panel,
                              float* out) {
  constexpr int64_t block_bytes = kQ4 ? kQ4BlockBytes : kQ8BlockBytes;
  float total[kPanel] = {};
  for (int64_t b = 0; b < xq.blocks; ++b) {
    const uint8_t* block = panel + b * block_bytes;
    const float* d = reinterpret_cast<const float*>(block);
    const int64_t at = row * xq.k + b * kQ4BlockK, slot = row * xq.blocks + b;
    const float s = xq.scale[slot];
    const int32_t x_sum = xq.sum[slot];
    for (int j = 0; j < kPanel; ++j) {
      int32_t level_sum = 0;
      for (int r = 0; r < kQ4BlockK; ++r) {
        const int32_t level =
            kQ4 ? ((block[2 * kPanel * 4 + r / 2 * kPanel + j] >> (4 * (r & 1))) & 15) -
                      kQ4ZeroLevel
                : static_cast<int8_t>(block[kPanel * 4 + r * kPanel + j]);
        const int32_t q = xq.wide ? xq.high[at + r] * 256 + xq.low[at + r] : xq.high[at + r];
        level_sum += level * q;
      }
      const float inner =
          kQ4 ? __builtin_fmaf(d[j], static_cast<float>(level_sum),
                               d[kPanel + j] * static_cast<float>(x_sum))
              : d[j] * static_cast<float>(level_sum);
      total[j] = __builtin_fmaf(s, inner, total[j]);
    }
  }
  for (int j = 0; j < kPanel; ++j) out[j] = total[j];
}

#if defined(EK_ISA_AVX512)
/// x's 4 bytes at `p`, in every 32-bit lane.
EK_VNNI static inline __m512i broadcast4(const void* p) {
  int32_t four;
  __builtin_memcpy(&four, p, 4);
  return _mm512_set1_epi32(four);
}

/// Rows [row0, row0 + MR) x panels [0, J) of a Q4 / Q8 pack (panels `panel_bytes` apart), the
/// formula above with VNNI: per 64 bytes of a block (4 row pairs / 4 rows of 16 columns),
/// vpermb gathers each column's 4 bytes into its 32-bit lane, and one vpdpbusd per 4 k (Q4:
/// the low nibbles hold the even k, the high the odd: two) adds x's bytes times the weights'
/// into the lane. vpdpbusd multiplies unsigned by signed bytes: with x's signed (high) bytes,
/// Q4 multiplies q (0..15) and subtracts 8 X after the block, Q8 flips the sign bit (q + 128)
/// and subtracts 128 X_high; x's unsigned low bytes (int16, kWide) take the weights as the
/// signed side (Q4's q fits). S = 256 S_high + S_low. `ahead`: the next tile's panels
/// (`ahead_panels` of them, same stride), prefetched block by block.
template <int MR, int J, bool kQ4, bool kWide>
EK_VNNI static void int8_tile_vnni(const QuantizedRows& xq, int64_t row0, const uint8_t* panels,
                                   int64_t panel_bytes, float* out, const uint8_t* ahead,
                                   int ahead_panels) {
  constexpr int64_t block_bytes = kQ4 ? kQ4BlockBytes : kQ8BlockBytes;
  constexpr int64_t scale_bytes = kQ4 ? 2 * kPanel * 4 : kPanel * 4;
  constexpr int vectors = static_cast<int>((block_bytes - scale_bytes) / 64);
  alignas(64) static const uint8_t kGather[64] = {
      0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51,
      4, 20, 36, 52, 5, 21, 37, 53, 6, 22, 38, 54, 7, 23, 39, 55,
      8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59,
      12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};
  const __m512i gather = _mm512_load_si512(kGather);
  const __m512i nibble = _mm512_set1_epi8(0x0F), sign = _mm512_set1_epi8(-128);
  __m512 total[MR][J];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < J; ++j) total[i][j] = _mm512_setzero_ps();
  const int64_t first = row0 * xq.k;
  const int8_t* high = (kQ4 ? xq.high_paired : xq.high) + first;
  const uint8_t* low = (kQ4 ? xq.low_paired : xq.low) + first;
  for (int64_t b = 0; b < xq.blocks; ++b) {
    for (int j = 0; j < ahead_panels; ++j)
      for (int64_t line = 0; line < block_bytes; line += 64)
        __builtin_prefetch(ahead + j * panel_bytes + b * block_bytes + line, 0, 2);
    __m512i acc[MR][J], acc_low[MR][J];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < J; ++j) acc[i][j] = acc_low[i][j] = _mm512_setzero_si512();
    for (int v = 0; v < vectors; ++v) {
      const int64_t at = b * kQ4BlockK + v * (kQ4 ? 8 : 4);
      for (int j = 0; j < J; ++j) {
        const __m512i bytes = _mm512_permutexvar_epi8(
            gather, _mm512_loadu_si512(panels + j * panel_bytes + b * block_bytes + scale_bytes +
                                       v * 64));
        if constexpr (kQ4) {
          const __m512i even = _mm512_and_si512(bytes, nibble);
          const __m512i odd = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
          for (int i = 0; i < MR; ++i) {
            const int64_t x = i * xq.k + at;
            acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], even, broadcast4(high + x));
            acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], odd, broadcast4(high + x + 4));
            if constexpr (kWide) {
              acc_low[i][j] = _mm512_dpbusd_epi32(acc_low[i][j], broadcast4(low + x), even);
              acc_low[i][j] = _mm512_dpbusd_epi32(acc_low[i][j], broadcast4(low + x + 4), odd);
            }
          }
        } else {
          const __m512i flipped = _mm512_xor_si512(bytes, sign);
          for (int i = 0; i < MR; ++i) {
            const int64_t x = i * xq.k + at;
            acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], flipped, broadcast4(high + x));
            if constexpr (kWide)
              acc_low[i][j] = _mm512_dpbusd_epi32(acc_low[i][j], broadcast4(low + x), bytes);
          }
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      const int64_t slot = (row0 + i) * xq.blocks + b;
      const int32_t x_sum = xq.sum[slot];
      const __m512 s = _mm512_set1_ps(xq.scale[slot]);
      const __m512 x_sum_f = _mm512_set1_ps(static_cast<float>(x_sum));
      for (int j = 0; j < J; ++j) {
        const float* d = reinterpret_cast<const float*>(panels + j * panel_bytes + b * block_bytes);
        __m512i level_sum = acc[i][j];
        if constexpr (!kQ4)  // the flipped sign bit: sum (q + 128) high = S_high + 128 X_high
          level_sum = _mm512_sub_epi32(level_sum, _mm512_set1_epi32(128 * xq.high_sum[slot]));
        if constexpr (kWide)
          level_sum = _mm512_add_epi32(_mm512_slli_epi32(level_sum, 8), acc_low[i][j]);
        if constexpr (kQ4)  // q -> the level q - 8
          level_sum = _mm512_sub_epi32(level_sum, _mm512_set1_epi32(kQ4ZeroLevel * x_sum));
        const __m512 levels = _mm512_cvtepi32_ps(level_sum);
        const __m512 inner =
            kQ4 ? _mm512_fmadd_ps(_mm512_loadu_ps(d), levels,
                                  _mm512_mul_ps(_mm512_loadu_ps(d + kPanel), x_sum_f))
                : _mm512_mul_ps(_mm512_loadu_ps(d), levels);
        total[i][j] = _mm512_fmadd_ps(s, inner, total[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < J; ++j) _mm512_storeu_ps(out + (i * J + j) * kPanel, total[i][j]);
}

/// int8_tile_vnni for run-time counts rows in [1, MR], panels in [1, J].
template <int MR, int J, bool kQ4, bool kWide>
EK_VNNI static void int8_tile_any(int rows, int panels, const QuantizedRows& xq, int64_t row0,
                                  const uint8_t* w, int64_t panel_bytes, float* out,
                                  const uint8_t* ahead, int ahead_panels) {
  if (rows < MR) {
    if constexpr (MR > 1)
      int8_tile_any<MR - 1, J, kQ4, kWide>(rows, panels, xq, row0, w, panel_bytes, out, ahead,
                                           ahead_panels);
  } else if (panels < J) {
    if constexpr (J > 1)
      int8_tile_any<MR, J - 1, kQ4, kWide>(rows, panels, xq, row0, w, panel_bytes, out, ahead,
                                           ahead_panels);
  } else {
    int8_tile_vnni<MR, J, kQ4, kWide>(xq, row0, w, panel_bytes, out, ahead, ahead_panels);
  }
}
#endif

/// Tiles of the quantized GEMM: one row keeps 4 panels' streams in flight; more rows go 4 at a
/// time over 2 panels (int16: 6 rows over 1 panel: with two accumulators per output, 4 x 2
/// spilled, 1.5-1.7x slower; 6 x 1 against 4 x 1 0.95-0.98x at 4-64 rows), which stay in L1 /
/// L2 while every row tile passes over them. At 16 rows both run at about the VNNI rate.
constexpr int kInt8SingleRowPanels = 4, kInt8RowTile = 4, kInt8PanelTile = 2;
constexpr int kInt16PanelTile = 1, kInt16RowTile = 6;
constexpr int kTileOutputs = kInt8RowTile * kInt8SingleRowPanels;  ///< panels x rows, at most
static_assert(kInt8RowTile * kInt8PanelTile <= kTileOutputs &&
                  kInt16RowTile * kInt16PanelTile <= kTileOutputs,
              "every tile's outputs fit int8_panels' buffer");

#if defined(EK_ISA_AVX512)
/// Rows [r, r + rows) x `panels` panels from `w` with VNNI (the tile shape as above).
template <bool kQ4, bool kWide>
EK_VNNI static void int8_tiles_vnni(int64_t m, int rows, int panels, const QuantizedRows& xq,
                                    int64_t r, const uint8_t* w, int64_t panel_bytes, float* out,
                                    const uint8_t* ahead, int ahead_panels) {
  constexpr int kTile = kWide ? kInt16PanelTile : kInt8PanelTile;
  if (m == 1)
    int8_tile_any<1, kInt8SingleRowPanels, kQ4, kWide>(1, panels, xq, r, w, panel_bytes, out,
                                                       ahead, ahead_panels);
  else  // later row tiles find the panels in cache: only the first prefetches
    int8_tile_any<kWide ? kInt16RowTile : kInt8RowTile, kTile, kQ4, kWide>(
        rows, panels, xq, r, w, panel_bytes, out, ahead, r == 0 ? ahead_panels : 0);
}
#endif

/// Every row, panels [p0, p1) of one Q4 / Q8 segment: `vnni` picks the VNNI tiles, else the
/// scalar panels; the results are the same bits.
template <bool kQ4>
static void int8_panels(const LinearArgs& a, const QuantizedRows& xq, const LinearSegment& s,
                        int64_t p0, int64_t p1, bool vnni) {
  const auto* packed = static_cast<const uint8_t*>(s.w.data);
  const int64_t panel_bytes = xq.blocks * (kQ4 ? kQ4BlockBytes : kQ8BlockBytes);
  const int tile = a.m == 1 ? kInt8SingleRowPanels : xq.wide ? kInt16PanelTile : kInt8PanelTile;
  alignas(64) float out[kTileOutputs * kPanel];
  for (int64_t p = p0; p < p1; p += tile) {
    const int panels = static_cast<int>(p1 - p < tile ? p1 - p : tile);
    const uint8_t* w = packed + p * panel_bytes;
    const uint8_t* ahead = w + tile * panel_bytes;  // the next tile's panels, if any
    const int ahead_panels = static_cast<int>(p1 - p - panels < tile ? p1 - p - panels : tile);
    const int64_t row_tile = a.m == 1 ? 1 : xq.wide ? kInt16RowTile : kInt8RowTile;
    for (int64_t r = 0; r < a.m; r += row_tile) {
      const int rows = static_cast<int>(a.m - r < row_tile ? a.m - r : row_tile);
#if defined(EK_ISA_AVX512)
      if (vnni) {
        if (xq.wide)
          int8_tiles_vnni<kQ4, true>(a.m, rows, panels, xq, r, w, panel_bytes, out, ahead,
                                     ahead_panels);
        else
          int8_tiles_vnni<kQ4, false>(a.m, rows, panels, xq, r, w, panel_bytes, out, ahead,
                                      ahead_panels);
      }
#else
      (void)ahead;
      (void)ahead_panels;
#endif
      if (!vnni)
        for (int i = 0; i < rows; ++i)
          for (int j = 0; j < panels; ++j)
            int8_panel_scalar<kQ4>(xq, r + i, w + j * panel_bytes, out + (i * panels + j) * kPanel);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < panels; ++j) {
          const int64_t col = (p + j) * kPanel;
          const float* bias = s.bias != nullptr ? s.bias + col : nullptr;
          store_tile<1, kPanelVectors>(out + (i * panels + j) * kPanel, bias,
                                       s.y + (r + i) * s.ldy + col, s.ldy, s.n - col);
        }
    }
  }
}

static bool is_block_pack(PackFormat f) { return f == PackFormat::kQ4 || f == PackFormat::kQ8; }

/// The quantized GEMM over segments that are all Q4 / Q8 packs (a.widened: the workspace); x
/// rounded to int16 (`wide`) or int8.
static void linear_int8(const LinearArgs& a, bool wide) {
  int64_t total = 0, columns = 0;
  for (int i = 0; i < a.num_segments; ++i) {
    total += (a.segments[i].n + kPanel - 1) / kPanel;
    columns += a.segments[i].n;
  }
#if defined(EK_ISA_AVX512)
  const bool vnni = cpu_modes.vnni;
#else
  const bool vnni = false;  // compiled without the VNNI tiles: the scalar panels
#endif
#pragma omp parallel num_threads(a.threads) if (a.m * a.k * columns >= kParallelMinMacs)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const Share share = thread_share(total, t, threads);
    float* own = a.widened + t * linear_workspace_floats(a.k, a.m);
    const QuantizedRows xq =
        quantized_rows(own + linear_int8_offset_floats(a.k, a.m), a.m, a.k, wide);
    if (share.begin < share.end)  // each thread its own copy
      quantize_rows(a.x, a.m, a.ldx, xq, vnni);
    // (no look-ahead here: int8_panels asks for its own blocks ahead)
    for_each_segment_share<false>(a, t, threads,
                                  [&](const LinearSegment& s, int64_t p0, int64_t p1, LineRange) {
      if (s.w.format == PackFormat::kQ4)
        int8_panels<true>(a, xq, s, p0, p1, vnni);
      else
        int8_panels<false>(a, xq, s, p0, p1, vnni);
    });
  }
}

/// The GEMM: decoder_linear.h's over every segment, or, with quantized activations on
/// (cpu_modes.activation_bits), the quantized GEMM over the Q4 / Q8 segments and
/// decoder_linear.h's over the others.
static void linear(const LinearArgs& a) {
  const int bits = cpu_modes.activation_bits;  // read once: every part of a call alike
  if (bits == 0) return linear_packed(a);
  int blocks = 0;
  for (int i = 0; i < a.num_segments; ++i) blocks += is_block_pack(a.segments[i].w.format);
  if (blocks == a.num_segments) return linear_int8(a, bits == 16);
  if (blocks == 0) return linear_packed(a);
  for (int i = 0; i < a.num_segments; ++i) {  // a mixed group (rare): one segment at a time
    LinearArgs one = a;
    one.segments = a.segments + i;
    one.num_segments = 1;
    if (is_block_pack(a.segments[i].w.format))
      linear_int8(one, bits == 16);
    else
      linear_packed(one);
  }
}
