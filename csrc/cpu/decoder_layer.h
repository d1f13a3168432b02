/**
 * @file decoder_layer.h
 * @brief One whole decoder layer in one call (contract: eagle_kernels.ops.reference.decoder_layer;
 *        see DecoderLayerArgs in kernels.h). Included inside an instruction-set namespace after
 *        decoder_linear.h, decoder.h and attention.h, whose kernels it composes unchanged:
 *        every row is computed exactly as the one-op-at-a-time path computes it (row invariance
 *        holds, and the fused layer equals the unfused cpu ops bit for bit).
 */

/// y[:, :n] for one weight (+ bias) of a linear layer over rows x [m, k].
static LinearSegment segment(PackedWeight w, const float* bias, float* y, int64_t n) {
  return LinearSegment{w, bias, y, n, n};
}

static void run_linear(const DecoderLayerArgs& a, const float* x, int64_t m, int64_t k,
                       const LinearSegment* segments, int count, LookAhead then) {
  linear(LinearArgs{x, m, k, k, segments, count, a.linear_workspace, a.threads, then});
}

/// New K/V rows into the cache at lens[b] + tree_offset + t; rows that would land outside
/// [0, max_len) are dropped (a caller bug with value checks off must not write out of bounds).
static void write_cache(const DecoderLayerArgs& a, const float* k, const float* v) {
  const int64_t width = a.kv_heads * a.head_dim;
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t t = 0; t < a.count; ++t) {
      const int64_t slot = static_cast<int64_t>(a.lens[b]) + a.tree_offset + t;
      if (slot < 0 || slot >= a.max_len) continue;
      const int64_t row = b * a.count + t;
      float* k_dst = a.k_cache + (b * a.max_len + slot) * width;
      float* v_dst = a.v_cache + (b * a.max_len + slot) * width;
      for (int64_t i = 0; i < width; ++i) {
        k_dst[i] = k[row * width + i];
        v_dst[i] = v[row * width + i];
      }
    }
  }
}

/// out = h + d, row by row (one rounding per element, as torch's add).
static void add_rows(const float* h, const float* d, float* out, int64_t count, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (count >= 65536)
  for (int64_t i = 0; i < count; i += kW) {
    const int n = static_cast<int>(count - i < kW ? count - i : kW);
    vstore_n(out + i, vadd(vload_n(h + i, n), vload_n(d + i, n)), n);
  }
}

static void decoder_layer(const DecoderLayerArgs& a) {
  const int64_t rows = a.batch * a.count;
  const int64_t q_width = a.q_heads * a.head_dim, kv_width = a.kv_heads * a.head_dim;
  float* normed = a.workspace;                 // [M, in]
  float* q = normed + rows * a.in_features;    // [M, q_width]
  float* attended = q + rows * q_width;        // [M, q_width]
  float* k = attended + rows * q_width;        // [M, kv_width]
  float* v = k + rows * kv_width;              // [M, kv_width]
  float* o = v + rows * kv_width;              // [M, hidden]
  float* h = o + rows * a.hidden;              // [M, hidden]
  float* normed2 = h + rows * a.hidden;        // [M, hidden]
  float* down = normed2 + rows * a.hidden;     // [M, hidden]
  float* gate = down + rows * a.hidden;        // [M, intermediate]
  float* up = gate + rows * a.intermediate;    // [M, intermediate]

  const float* attention_input = a.x;
  if (a.input_norm != nullptr) {
    rms_norm(RmsNormArgs{a.x, nullptr, nullptr, a.input_norm, normed, rows, a.in_features,
                         a.in_features, a.in_features, a.eps, a.threads});
    attention_input = normed;
  }
  // Each GEMM knows what runs next, so each thread's last tile asks for the first lines it
  // reads there (LookAhead): the attention's first key block after q/k/v (the
  // output projection's first tile where the attention does not split), the next GEMM's first
  // tile after the others, the next layer's q/k/v after the last (a.next_qkv).
  const AttentionArgs attention{q, a.k_cache, a.v_cache, a.lens, a.tree_mask, attended, a.batch,
                                a.count, a.q_heads, a.kv_heads, a.head_dim, a.max_len,
                                a.tree_offset + a.count, a.words, a.scale,
                                a.attention_workspace, a.threads};
  const GemmAhead o_ahead{{a.wo}, {a.hidden}, 1, q_width};
  const GemmAhead gate_up_ahead{{a.wg, a.wu}, {a.intermediate, a.intermediate}, 2, a.hidden};
  const GemmAhead down_ahead{{a.wd}, {a.hidden}, 1, a.intermediate};
  const LookAhead after_qkv = attention_splits(a.count, a.threads)
                                  ? LookAhead{attention_first_keys, &attention}
                                  : LookAhead{gemm_first_tile, &o_ahead};
  const LinearSegment qkv[3] = {segment(a.wq, a.bq, q, q_width), segment(a.wk, a.bk, k, kv_width),
                                segment(a.wv, a.bv, v, kv_width)};
  run_linear(a, attention_input, rows, a.in_features, qkv, 3, after_qkv);
  rope(RopeArgs{q, a.positions, a.cos, a.sin, rows, a.q_heads, a.head_dim, q_width, a.table_rows,
                a.threads});
  rope(RopeArgs{k, a.positions, a.cos, a.sin, rows, a.kv_heads, a.head_dim, kv_width,
                a.table_rows, a.threads});
  write_cache(a, k, v);
  tree_attention(attention);
  const LinearSegment out_proj = segment(a.wo, a.bo, o, a.hidden);
  run_linear(a, attended, rows, q_width, &out_proj, 1, {gemm_first_tile, &gate_up_ahead});
  rms_norm(RmsNormArgs{o, a.residual, h, a.post_norm, normed2, rows, a.hidden, a.hidden,
                       a.hidden, a.eps, a.threads});
  const LinearSegment gate_up[2] = {segment(a.wg, a.bg, gate, a.intermediate),
                                    segment(a.wu, a.bu, up, a.intermediate)};
  run_linear(a, normed2, rows, a.hidden, gate_up, 2, {gemm_first_tile, &down_ahead});
  silu_mul(SiluMulArgs{gate, up, gate, rows, a.intermediate, a.intermediate, a.intermediate,
                       a.threads});
  const LinearSegment down_proj = segment(a.wd, a.bd, down, a.hidden);
  run_linear(a, gate, rows, a.intermediate, &down_proj, 1,
             a.next_qkv != nullptr ? LookAhead{gemm_first_tile, a.next_qkv} : LookAhead{});
  add_rows(h, down, a.out, rows * a.hidden, a.threads);
}
