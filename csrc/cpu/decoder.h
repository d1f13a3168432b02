/**
 * @file decoder.h
 * @brief CPU kernels of a decoder layer's per-token work beside its GEMM (decoder_linear.h):
 *        RMSNorm, SiLU * up, rotary embedding. Included inside an instruction-set namespace
 *        after simd.h.
 *
 * Contracts: eagle_kernels/ops/decoder.py (and reference.py's rms_norm / silu_mul /
 * apply_rope). Every kernel computes each output row by code independent of the row count and
 * of the thread count (see kernels.h): that is the row-invariance the lossless runtime relies on.
 */

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
