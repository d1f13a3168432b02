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
// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), the weight used in place (torch's [N, K]
// layout, no packing). Each output is one vector accumulator: lane l gathers k = l (mod kW) in
// increasing k with FMAs, then vhsum adds the lanes in its fixed order. A tile of MR rows x NR
// columns runs MR * NR such chains side by side, sharing the loads; the tile shape changes the
// speed, never the value. Threads split the columns (all segments laid end to end); within a
// thread, columns go in blocks that fit L2 while the row tiles of x stay in L1.

#if defined(EK_ISA_AVX512)
constexpr int kTileRows = 4, kTileCols = 6;  // 24 accumulators of 32 registers
#else
constexpr int kTileRows = 4, kTileCols = 3;  // 12 accumulators of 16 registers
#endif
constexpr int kSingleRowCols = 8;             // m == 1: streaming, memory-bound
constexpr int64_t kColumnBlockBytes = 160 * 1024;
// Below this many multiply-adds a GEMM runs on one thread: waking the team costs more.
constexpr int64_t kParallelMinMacs = 1 << 16;

template <int MR, int NR>
static void dot_tile(const float* x, int64_t ldx, const float* w, int64_t k, const float* bias,
                     float* y, int64_t ldy) {
  vf acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = vzero();
  int64_t kk = 0;
  for (; kk + kW <= k; kk += kW) {
    vf wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = vload(w + j * k + kk);
    for (int i = 0; i < MR; ++i) {
      const vf xv = vload(x + i * ldx + kk);
      for (int j = 0; j < NR; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
  if (kk < k) {  // the same chain, zero-padded: 0 * 0 adds nothing to a lane
    const int rest = static_cast<int>(k - kk);
    vf wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = vload_n(w + j * k + kk, rest);
    for (int i = 0; i < MR; ++i) {
      const vf xv = vload_n(x + i * ldx + kk, rest);
      for (int j = 0; j < NR; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float value = vhsum(acc[i][j]);
      if (bias != nullptr) value += bias[j];
      y[i * ldy + j] = value;
    }
}

template <int MR>
static void dot_tile_cols(int cols, const float* x, int64_t ldx, const float* w, int64_t k,
                          const float* bias, float* y, int64_t ldy) {
  switch (cols) {
    case 1: dot_tile<MR, 1>(x, ldx, w, k, bias, y, ldy); break;
    case 2: dot_tile<MR, 2>(x, ldx, w, k, bias, y, ldy); break;
    case 3: dot_tile<MR, 3>(x, ldx, w, k, bias, y, ldy); break;
#if defined(EK_ISA_AVX512)
    case 4: dot_tile<MR, 4>(x, ldx, w, k, bias, y, ldy); break;
    case 5: dot_tile<MR, 5>(x, ldx, w, k, bias, y, ldy); break;
    case 6: dot_tile<MR, 6>(x, ldx, w, k, bias, y, ldy); break;
#endif
    default: break;
  }
}

static void dot_tile_any(int rows, int cols, const float* x, int64_t ldx, const float* w,
                         int64_t k, const float* bias, float* y, int64_t ldy) {
  switch (rows) {
    case 1: dot_tile_cols<1>(cols, x, ldx, w, k, bias, y, ldy); break;
    case 2: dot_tile_cols<2>(cols, x, ldx, w, k, bias, y, ldy); break;
    case 3: dot_tile_cols<3>(cols, x, ldx, w, k, bias, y, ldy); break;
    default: dot_tile_cols<4>(cols, x, ldx, w, k, bias, y, ldy); break;
  }
}

/// Columns [c0, c1) of one segment, every row of x.
static void linear_columns(const LinearArgs& a, const LinearSegment& s, int64_t c0, int64_t c1) {
  if (a.m == 1) {
    int64_t c = c0;
    for (; c + kSingleRowCols <= c1; c += kSingleRowCols)
      dot_tile<1, kSingleRowCols>(a.x, a.ldx, s.w + c * a.k, a.k, s.bias ? s.bias + c : nullptr,
                                  s.y + c, s.ldy);
    for (; c < c1; c += kTileCols) {
      const int cols = static_cast<int>(c1 - c < kTileCols ? c1 - c : kTileCols);
      dot_tile_any(1, cols, a.x, a.ldx, s.w + c * a.k, a.k, s.bias ? s.bias + c : nullptr,
                   s.y + c, s.ldy);
    }
    return;
  }
  int64_t block = kColumnBlockBytes / (a.k * 4) / kTileCols * kTileCols;
  if (block < kTileCols) block = kTileCols;
  for (int64_t b0 = c0; b0 < c1; b0 += block) {
    const int64_t b1 = b0 + block < c1 ? b0 + block : c1;
    for (int64_t r = 0; r < a.m; r += kTileRows) {
      const int rows = static_cast<int>(a.m - r < kTileRows ? a.m - r : kTileRows);
      for (int64_t c = b0; c < b1; c += kTileCols) {
        const int cols = static_cast<int>(b1 - c < kTileCols ? b1 - c : kTileCols);
        dot_tile_any(rows, cols, a.x + r * a.ldx, a.ldx, s.w + c * a.k, a.k,
                     s.bias ? s.bias + c : nullptr, s.y + r * s.ldy + c, s.ldy);
      }
    }
  }
}

static void linear(const LinearArgs& a) {
  int64_t total = 0;
  for (int i = 0; i < a.num_segments; ++i) total += a.segments[i].n;
#pragma omp parallel num_threads(a.threads) if (a.m * a.k * total >= kParallelMinMacs)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    // Column range of this thread over all segments end to end, cut at multiples of 8.
    const int64_t begin = total * t / threads / 8 * 8;
    const int64_t end = t + 1 == threads ? total : total * (t + 1) / threads / 8 * 8;
    int64_t offset = 0;
    for (int i = 0; i < a.num_segments; ++i) {
      const LinearSegment& s = a.segments[i];
      const int64_t c0 = begin > offset ? begin - offset : 0;
      const int64_t c1 = end - offset < s.n ? end - offset : s.n;
      if (c0 < c1) linear_columns(a, s, c0, c1);
      offset += s.n;
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
