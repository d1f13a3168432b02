/**
 * @file simd.h
 * @brief One fp32 vector type per instruction set, with the few operations the CPU kernels use.
 *
 * Included by the kernel headers INSIDE an instruction-set namespace (see isa_avx512.cpp,
 * isa_avx2.cpp, isa_generic.cpp): each translation unit defines exactly one of EK_ISA_AVX512,
 * EK_ISA_AVX2 or EK_ISA_GENERIC and enables that instruction set with `#pragma GCC target`
 * before including <immintrin.h>. Nothing here may call an inline function of the standard
 * library: such a function would be compiled once per instruction set under one linker name,
 * and the linker could hand the AVX-512 copy to an AVX2 machine. Only intrinsics, builtins and
 * functions of this namespace are used.
 *
 * Every reduction the kernels do has ONE fixed order per instruction set (documented at each
 * function): this is what makes a token's result independent of how many tokens are computed
 * with it (row invariance), and so greedy speculative decoding bit-exact.
 */

#define EK_INLINE inline __attribute__((always_inline))

#if defined(EK_ISA_AVX512)

constexpr int kW = 16;  ///< fp32 lanes per vector
using vf = __m512;

EK_INLINE __mmask16 lane_mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
EK_INLINE vf vzero() { return _mm512_setzero_ps(); }
EK_INLINE vf vset1(float x) { return _mm512_set1_ps(x); }
EK_INLINE vf vload(const float* p) { return _mm512_loadu_ps(p); }
/// First `n` lanes from `p` (0 <= n <= kW), the others zero; never touches p[n..).
EK_INLINE vf vload_n(const float* p, int n) { return _mm512_maskz_loadu_ps(lane_mask(n), p); }
/// kW bf16 values from `p`, widened exactly to fp32 (a bf16 is the top half of an fp32).
EK_INLINE vf vload_bf16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
/// The levels q - kQ4ZeroLevel of two rows of a Q4 block (decoder_linear.h kQ4BlockBytes) for the
/// panel's 16 columns, as exact fp32: the 16 bytes at `pair` hold column j's q of the even row in
/// byte j's low nibble and of the odd row in its high nibble. One widening load puts byte j in
/// lane j; vpermps looks a lane's level up in a 16-entry table by the lane's low 4 bits alone
/// (it ignores the others), so the even row's levels cost one op and the odd row's a shift and
/// one op: 3 vector ops per 32 weights beside their 2 FMAs, against 3 per 16 for a rebuild of
/// d q + m (Zen 4's 512-bit ops share 4 half-width pipes, so the op count is the GEMV's limit:
/// in L1, one row x 4 panels, 10.6 -> 8.6 cycles a row). `v` is unused (one vector, 16 columns).
EK_INLINE void vq4_level_pair(const uint8_t* pair, int v, vf* even, vf* odd) {
  (void)v;
  const vf levels = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  static_assert(kQ4ZeroLevel == 8, "the level table starts at -kQ4ZeroLevel");
  const __m512i lanes =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pair)));
  *even = _mm512_permutexvar_ps(lanes, levels);
  *odd = _mm512_permutexvar_ps(_mm512_srli_epi32(lanes, 4), levels);
}
/// kW int8 values from `p`, as exact fp32.
EK_INLINE vf vload_q8(const int8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}
EK_INLINE void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
EK_INLINE void vstore_n(float* p, vf v, int n) { _mm512_mask_storeu_ps(p, lane_mask(n), v); }
EK_INLINE vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
EK_INLINE vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
EK_INLINE vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
EK_INLINE vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
EK_INLINE vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
EK_INLINE vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
/// Lanes where a < b take `if_less`, the others `otherwise`.
EK_INLINE vf vselect_less(vf a, vf b, vf if_less, vf otherwise) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), otherwise, if_less);
}
/// 2^n for integral-valued n in [-126, 127].
EK_INLINE vf vexp2_int(vf n) {
  __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_castsi512_ps(bits);
}
EK_INLINE vf vround(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/// Sum of the lanes, always in this order: lanes i and i+8 first, then the AVX2 tree below.
EK_INLINE float vhsum(vf v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
EK_INLINE float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
/// Bit i set where !(a[i] <= b[i]): a above b, or either of them NaN.
EK_INLINE unsigned vmask_not_le(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_NLE_UQ); }

/// Vectors whose sums vhsum_block forms at once (attention.h's key blocks).
constexpr int kSumBlock = 16;
/// The slot of vhsum_block's input whose sum lands at output j: the levels below leave vector
/// s's sum in lane 4 (s % 4) + s / 4, a 4 x 4 transpose (its own inverse).
constexpr int sum_slot(int j) { return j % 4 * 4 + j / 4; }
/// out[j] = vhsum(v[sum_slot(j)]) * scale for j < kSumBlock, bit for bit: the very additions of
/// vhsum (lane i + lane i + 8, then + 4, + 2, + 1, the lower operand first), for 16 vectors in
/// 15 vector adds and 30 in-register shuffles instead of 16 extract-and-add ladders (~140
/// instructions). Each level halves the partial sums of two vectors at once and packs the two
/// halves into one vector.
EK_INLINE void vhsum_block(const vf* v, float scale, float* out) {
  vf half[8], quarter[4], eighth[2];
  for (int i = 0; i < 8; ++i)  // lanes i + (i + 8) of v[2i] | of v[2i + 1]
    half[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                            _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // + 4: 128-bit blocks 0 + 1 and 2 + 3 of each
    quarter[i] = _mm512_add_ps(_mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], 0x88),
                               _mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // + 2 within each 128-bit block
    eighth[i] = _mm512_add_ps(_mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0x44),
                              _mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0xEE));
  const vf sums = _mm512_add_ps(_mm512_shuffle_ps(eighth[0], eighth[1], 0x88),  // + 1
                                _mm512_shuffle_ps(eighth[0], eighth[1], 0xDD));
  _mm512_storeu_ps(out, _mm512_mul_ps(sums, _mm512_set1_ps(scale)));
}

#elif defined(EK_ISA_AVX2)

constexpr int kW = 8;
using vf = __m256;

EK_INLINE __m256i lane_mask(int n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes);
}
EK_INLINE vf vzero() { return _mm256_setzero_ps(); }
EK_INLINE vf vset1(float x) { return _mm256_set1_ps(x); }
EK_INLINE vf vload(const float* p) { return _mm256_loadu_ps(p); }
EK_INLINE vf vload_n(const float* p, int n) { return _mm256_maskload_ps(p, lane_mask(n)); }
EK_INLINE vf vload_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
/// Vector `v` (columns 8v..8v+7) of the levels q - kQ4ZeroLevel of two rows of a Q4 block, exact
/// fp32: byte j of the 16 at `pair` holds column j's q of the even row in its low nibble, of
/// the odd row in its high nibble.
EK_INLINE void vq4_level_pair(const uint8_t* pair, int v, vf* even, vf* odd) {
  const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(pair + v * kW));
  const __m256i bytes = _mm256_cvtepu8_epi32(packed), zero = _mm256_set1_epi32(kQ4ZeroLevel);
  *even = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(bytes, _mm256_set1_epi32(15)), zero));
  *odd = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bytes, 4), zero));
}
EK_INLINE vf vload_q8(const int8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}
EK_INLINE void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
EK_INLINE void vstore_n(float* p, vf v, int n) { _mm256_maskstore_ps(p, lane_mask(n), v); }
EK_INLINE vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
EK_INLINE vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
EK_INLINE vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
EK_INLINE vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
EK_INLINE vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
EK_INLINE vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
EK_INLINE vf vselect_less(vf a, vf b, vf if_less, vf otherwise) {
  return _mm256_blendv_ps(otherwise, if_less, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
}
EK_INLINE vf vexp2_int(vf n) {
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(bits);
}
EK_INLINE vf vround(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/// Sum of the lanes, always in this order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
EK_INLINE float vhsum(vf v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
EK_INLINE float vhmax(vf v) {
  __m128 s4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 s2 = _mm_max_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_max_ss(s2, _mm_movehdup_ps(s2)));
}
EK_INLINE unsigned vmask_not_le(vf a, vf b) {
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_NLE_UQ)));
}

#elif defined(EK_ISA_GENERIC)

// Portable fallback: a 4-lane struct the compiler may vectorise however it likes, because every
// lane is computed independently and every cross-lane sum has the fixed order below.
constexpr int kW = 4;
struct vf {
  float l[4];
};

EK_INLINE vf vzero() { return vf{{0.f, 0.f, 0.f, 0.f}}; }
EK_INLINE vf vset1(float x) { return vf{{x, x, x, x}}; }
EK_INLINE vf vload(const float* p) { return vf{{p[0], p[1], p[2], p[3]}}; }
EK_INLINE vf vload_n(const float* p, int n) {
  vf r = vzero();
  for (int i = 0; i < n; ++i) r.l[i] = p[i];
  return r;
}
EK_INLINE vf vload_bf16(const uint16_t* p) {
  vf r;
  for (int i = 0; i < 4; ++i) {
    const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    __builtin_memcpy(&r.l[i], &bits, 4);
  }
  return r;
}
EK_INLINE void vq4_level_pair(const uint8_t* pair, int v, vf* even, vf* odd) {
  for (int i = 0; i < 4; ++i) {
    const int byte = pair[v * kW + i];
    even->l[i] = static_cast<float>((byte & 15) - kQ4ZeroLevel);
    odd->l[i] = static_cast<float>((byte >> 4) - kQ4ZeroLevel);
  }
}
EK_INLINE vf vload_q8(const int8_t* p) {
  return vf{{static_cast<float>(p[0]), static_cast<float>(p[1]), static_cast<float>(p[2]),
             static_cast<float>(p[3])}};
}
EK_INLINE void vstore(float* p, vf v) { for (int i = 0; i < 4; ++i) p[i] = v.l[i]; }
EK_INLINE void vstore_n(float* p, vf v, int n) { for (int i = 0; i < n; ++i) p[i] = v.l[i]; }
#define EK_GENERIC_BINARY(name, expr)                              \
  EK_INLINE vf name(vf a, vf b) {                                  \
    vf r;                                                          \
    for (int i = 0; i < 4; ++i) { float x = a.l[i], y = b.l[i]; r.l[i] = (expr); } \
    return r;                                                      \
  }
EK_GENERIC_BINARY(vadd, x + y)
EK_GENERIC_BINARY(vsub, x - y)
EK_GENERIC_BINARY(vmul, x * y)
EK_GENERIC_BINARY(vdiv, x / y)
EK_GENERIC_BINARY(vmax, x > y ? x : y)
#undef EK_GENERIC_BINARY
EK_INLINE vf vfma(vf a, vf b, vf c) {
  vf r;
  for (int i = 0; i < 4; ++i) r.l[i] = __builtin_fmaf(a.l[i], b.l[i], c.l[i]);
  return r;
}
EK_INLINE vf vselect_less(vf a, vf b, vf if_less, vf otherwise) {
  vf r;
  for (int i = 0; i < 4; ++i) r.l[i] = a.l[i] < b.l[i] ? if_less.l[i] : otherwise.l[i];
  return r;
}
EK_INLINE vf vexp2_int(vf n) {
  vf r;
  for (int i = 0; i < 4; ++i) {
    // A NaN lane (vexp of NaN: its polynomial is NaN too, so the product stays NaN, as on the
    // vector ISAs) must not reach the int conversion: converting NaN is undefined in C++.
    const int power = n.l[i] == n.l[i] ? static_cast<int>(n.l[i]) : 0;
    const int bits = (power + 127) << 23;
    __builtin_memcpy(&r.l[i], &bits, sizeof(float));
  }
  return r;
}
EK_INLINE vf vround(vf x) {
  vf r;
  for (int i = 0; i < 4; ++i) r.l[i] = __builtin_nearbyintf(x.l[i]);
  return r;
}
/// Sum of the lanes, always in this order: (l0+l2) + (l1+l3).
EK_INLINE float vhsum(vf v) { return (v.l[0] + v.l[2]) + (v.l[1] + v.l[3]); }
EK_INLINE float vhmax(vf v) {
  float a = v.l[0] > v.l[2] ? v.l[0] : v.l[2];
  float b = v.l[1] > v.l[3] ? v.l[1] : v.l[3];
  return a > b ? a : b;
}
EK_INLINE unsigned vmask_not_le(vf a, vf b) {
  unsigned bits = 0;
  for (int i = 0; i < 4; ++i) bits |= (a.l[i] <= b.l[i] ? 0u : 1u) << i;
  return bits;
}

#else
#error "define one of EK_ISA_AVX512, EK_ISA_AVX2, EK_ISA_GENERIC before including simd.h"
#endif

#if !defined(EK_ISA_AVX512)
/// vhsum_block's contract without a batched form: one vhsum per vector, in blocks of 8 (the
/// key blocks of attention.h: 8 chains in flight; 16 ymm registers hold no more).
constexpr int kSumBlock = 8;
constexpr int sum_slot(int j) { return j; }
EK_INLINE void vhsum_block(const vf* v, float scale, float* out) {
  for (int j = 0; j < kSumBlock; ++j) out[j] = vhsum(v[j]) * scale;
}
#endif

/**
 * @brief e^x per lane (Cephes-style: x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial;
 *        about 2 ulp). Lanes below -87.3 give exactly 0 (also -inf), lanes above 88 give
 *        e^88: the kernels only exponentiate values <= 0 (softmax) and -x of SiLU.
 */
EK_INLINE vf vexp(vf x) {
  const vf hi = vset1(88.0f), lo = vset1(-87.3f);
  const vf xc = vselect_less(hi, x, hi, vselect_less(x, lo, lo, x));
  const vf n = vround(vmul(xc, vset1(1.44269504088896341f)));
  vf r = vsub(xc, vmul(n, vset1(0.693359375f)));
  r = vsub(r, vmul(n, vset1(-2.12194440e-4f)));
  vf p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
  return vselect_less(x, lo, vzero(), vmul(p, vexp2_int(n)));
}

/// Lanes [0, n) of p, the others -inf (so their exponentials are exactly 0); never reads p[n..).
EK_INLINE vf load_or_minus_inf(const float* p, int n) {
  float lanes[kW];
  for (int i = 0; i < kW; ++i) lanes[i] = i < n ? p[i] : -__builtin_inff();
  return vload(lanes);
}
