/**
 * @file loss.h
 * @brief soft_cross_entropy forward and backward for the cpu backend (the EAGLE-3 training
 *        loss, eagle_kernels/ops/loss.py): the same math and saved statistics as the Triton
 *        kernels there, over fp32 rows, OpenMP over rows.
 *
 *   loss[t]      = log sx - sxy / sy             (= logsumexp(x_t) - sum_v p_tv x_tv)
 *   sx = sum_v e^(x_tv - mx),  sy = sum_v e^(y_tv - my),  sxy = sum_v e^(y_tv - my) (x_tv - mx)
 *   stats        = [mx, log sx, my, log sy] per row ([4, rows]), the backward's input
 *   grad_x[t, v] = (e^(x_tv - mx - log sx) - e^(y_tv - my - log sy)) * grad_loss[t]
 *
 * Why a kernel: torch composes this from log_softmax, softmax, a mask and a product, about 15
 * passes over [rows, V] fp32 per step (rows ~2000, V 8192: 65 MB each); this reads x and y
 * twice forward and once backward. A product term is taken only where the target weight is
 * positive: a token masked (-inf) in both would otherwise give 0 * -inf = NaN; a token masked in
 * x alone under a live target gives +inf, as the reference does.
 */

/// Max of row[0, n), starting from `floor` (finite: so x - max is never -inf - -inf).
static float row_max(const float* row, int64_t n, float floor) {
  vf best = vset1(floor);
  int64_t v = 0;
  for (; v + kW <= n; v += kW) best = vmax(best, vload(row + v));
  float m = vhmax(best);
  for (; v < n; ++v) m = row[v] > m ? row[v] : m;
  return m;
}

/// Adds the terms of x[v0, v1), y[v0, v1) to the three sums (see the file comment).
static void soft_ce_terms(const float* x, const float* y, int64_t v0, int64_t v1, vf vmx, vf vmy,
                          vf& sx, vf& sy, vf& sxy) {
  for (int64_t v = v0; v < v1; v += kW) {
    const int n = v1 - v < kW ? static_cast<int>(v1 - v) : kW;
    const vf xv = vsub(n == kW ? vload(x + v) : load_or_minus_inf(x + v, n), vmx);
    const vf w = vexp(vsub(n == kW ? vload(y + v) : load_or_minus_inf(y + v, n), vmy));
    sx = vadd(sx, vexp(xv));
    sy = vadd(sy, w);
    sxy = vfma(w, vselect_less(vzero(), w, xv, vzero()), sxy);  // lanes with w > 0 only
  }
}

static void soft_ce_row(const SoftCrossEntropyArgs& a, int64_t t) {
  const float* x = a.x + t * a.vocab;
  const float* y = a.y + t * a.vocab;
  const float mx = row_max(x, a.vocab, kLossMaxFloor), my = row_max(y, a.vocab, kLossMaxFloor);
  const vf vmx = vset1(mx), vmy = vset1(my);
  // Two-level sums (per block of kLossBlock, then across blocks): a 128k vocabulary adds 16k
  // terms per lane, whose rounding would otherwise grow past the reference's.
  vf sx = vzero(), sy = vzero(), sxy = vzero();
  for (int64_t v0 = 0; v0 < a.vocab; v0 += kLossBlock) {
    vf bx = vzero(), by = vzero(), bxy = vzero();
    soft_ce_terms(x, y, v0, v0 + kLossBlock < a.vocab ? v0 + kLossBlock : a.vocab, vmx, vmy,
                  bx, by, bxy);
    sx = vadd(sx, bx);
    sy = vadd(sy, by);
    sxy = vadd(sxy, bxy);
  }
  const float log_sx = __builtin_logf(vhsum(sx)), total_y = vhsum(sy);
  a.loss[t] = log_sx - vhsum(sxy) / total_y;
  a.stats[t] = mx;
  a.stats[a.rows + t] = log_sx;
  a.stats[2 * a.rows + t] = my;
  a.stats[3 * a.rows + t] = __builtin_logf(total_y);
}

static void soft_ce_forward(const SoftCrossEntropyArgs& a) {
#pragma omp parallel for num_threads(a.threads) schedule(static)
  for (int64_t t = 0; t < a.rows; ++t) soft_ce_row(a, t);
}

static void soft_ce_backward(const SoftCrossEntropyArgs& a) {
#pragma omp parallel for num_threads(a.threads) schedule(static)
  for (int64_t t = 0; t < a.rows; ++t) {
    const float* x = a.x + t * a.vocab;
    const float* y = a.y + t * a.vocab;
    float* grad = a.grad_x + t * a.vocab;
    // (x - max) - log sum, in that order (as torch's log_softmax): max + log sum rounded to
    // one fp32 first would lose log sum entirely at |x| ~ 1e4 (ulp 1e-3).
    const vf max_x = vset1(a.stats[t]), log_x = vset1(a.stats[a.rows + t]);
    const vf max_y = vset1(a.stats[2 * a.rows + t]), log_y = vset1(a.stats[3 * a.rows + t]);
    const vf g = vset1(a.grad_loss[t]);
    int64_t v = 0;
    for (; v < a.vocab; v += kW) {
      const int n = a.vocab - v < kW ? static_cast<int>(a.vocab - v) : kW;
      const vf xv = n == kW ? vload(x + v) : load_or_minus_inf(x + v, n);
      const vf yv = n == kW ? vload(y + v) : load_or_minus_inf(y + v, n);
      const vf d = vsub(vexp(vsub(vsub(xv, max_x), log_x)), vexp(vsub(vsub(yv, max_y), log_y)));
      if (n == kW) vstore(grad + v, vmul(d, g)); else vstore_n(grad + v, vmul(d, g), n);
    }
  }
}
