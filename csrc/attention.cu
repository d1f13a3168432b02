/**
 * @file attention.cu
 * @brief Tree attention kernel, split merge, launcher and host twin (see attention.cuh).
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <mma.h>

#include "attention.cuh"

namespace eagle_kernels {
namespace {

using attention::kBlockM;
using attention::kBlockN;
using attention::kThreads;
using attention::Problem;
using attention::RowState;

constexpr int kWarpRows = 16;  // rows per warp = the WMMA tile height
constexpr int kMaxDevices = 64;
constexpr int kRowsPerWarp = kBlockM / (kThreads / 32);
static_assert(kRowsPerWarp == kWarpRows, "each warp owns one 16-row WMMA strip");

/// Shared-memory layout of one CTA (byte offsets; every section 128-byte aligned, every
/// leading dimension padded so WMMA pointers stay 32-byte aligned and rows skew banks).
template <typename T, int D>
struct Layout {
  static constexpr int kLdQ = D + 8;         // Q, K, V tiles (T)
  static constexpr int kLdS = kBlockN + 4;   // logits (float)
  static constexpr int kLdP = kBlockN + 8;   // probabilities (T)
  static constexpr int kLdO = D + 4;         // output accumulator (float)
  static constexpr size_t align(size_t bytes) { return (bytes + 127) / 128 * 128; }
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + align(sizeof(T) * kBlockM * kLdQ);
  static constexpr size_t kV = kK + align(sizeof(T) * kBlockN * kLdQ);
  static constexpr size_t kS = kV + align(sizeof(T) * kBlockN * kLdQ);
  static constexpr size_t kP = kS + align(sizeof(float) * kBlockM * kLdS);
  static constexpr size_t kO = kP + align(sizeof(T) * kBlockM * kLdP);
  static constexpr size_t kBytes = kO + align(sizeof(float) * kBlockM * kLdO);
};

/// Stacked row -> (query, query head) of KV head `kv_head`.
struct RowIndex {
  int64_t query, head;
};

EK_HOST_DEVICE RowIndex row_index(int64_t row, int64_t group, int64_t kv_head) {
  return {row / group, kv_head * group + row % group};
}

/// Merge weights of one output row's splits into `weights`; returns 1 / their sum (0 when no
/// split saw a key). Shared by the merge kernel (one thread) and the host twin.
EK_HOST_DEVICE float merge_row(const float* part_lse, int64_t split_stride, int64_t num_splits,
                               float* weights) {
  float top = -INFINITY;
  for (int64_t s = 0; s < num_splits; ++s) {
    const float lse = part_lse[s * split_stride];
    top = lse > top ? lse : top;
  }
  float total = 0.0f;
  for (int64_t s = 0; s < num_splits; ++s) {
    weights[s] = attention::merge_weight(part_lse[s * split_stride], top);
    total += weights[s];
  }
  return total > 0.0f ? 1.0f / total : 0.0f;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int delta = 16; delta > 0; delta >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, delta));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int delta = 16; delta > 0; delta >>= 1) x += __shfl_xor_sync(0xffffffffu, x, delta);
  return x;
}

/// Copy `rows` rows of D elements (16-byte chunks) to a shared tile, zero-filling the rest
/// of the kBlockM / kBlockN rows (zero K/V rows keep masked lanes free of NaN garbage).
template <typename T, int D, typename RowPtr>
__device__ __forceinline__ void load_tile(T* tile, int tile_rows, int rows, RowPtr row_ptr) {
  constexpr int kChunks = D * sizeof(T) / 16;
  constexpr int kElems = 16 / sizeof(T);
  for (int c = threadIdx.x; c < tile_rows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = (c % kChunks) * kElems;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      const T* source = row_ptr(r);
      if (source != nullptr) value = *reinterpret_cast<const uint4*>(source + col);
    }
    *reinterpret_cast<uint4*>(tile + r * Layout<T, D>::kLdQ + col) = value;
  }
}

/**
 * Grid (row tile x KV head, sequence, split), kThreads threads, Layout::kBytes dynamic shared
 * memory. Warp w owns rows [16 w, 16 w + 16) of the tile from S to the epilogue, so only the
 * K/V tile loads need CTA-wide barriers.
 */
template <typename T, int D, bool kSplit>
__global__ void __launch_bounds__(kThreads)
tree_attention_kernel(const T* __restrict__ q, const T* __restrict__ k_cache,
                      const T* __restrict__ v_cache, const int32_t* __restrict__ cache_lens,
                      const int32_t* __restrict__ tree_mask, T* __restrict__ out,
                      float* __restrict__ part_o, float* __restrict__ part_lse, Problem p) {
  namespace wmma = nvcuda::wmma;
  using L = Layout<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* s_q = reinterpret_cast<T*>(smem + L::kQ);
  T* s_k = reinterpret_cast<T*>(smem + L::kK);
  T* s_v = reinterpret_cast<T*>(smem + L::kV);
  float* s_s = reinterpret_cast<float*>(smem + L::kS);
  T* s_p = reinterpret_cast<T*>(smem + L::kP);
  float* s_o = reinterpret_cast<float*>(smem + L::kO);

  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t rows_total = p.num_queries * group;
  const int64_t row_tiles = ceil_div(rows_total, kBlockM);
  const int64_t kv_head = blockIdx.x / row_tiles;  // neighbouring CTAs share K/V in L2
  const int64_t row0 = (blockIdx.x % row_tiles) * kBlockM;
  const int64_t b = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  load_tile<T, D>(s_q, kBlockM, kBlockM, [&](int r) -> const T* {
    if (row0 + r >= rows_total) return nullptr;
    const RowIndex at = row_index(row0 + r, group, kv_head);
    return q + b * p.stride_qb + at.query * p.stride_qn + at.head * p.stride_qh;
  });
  for (int i = threadIdx.x; i < kBlockM * L::kLdO; i += kThreads) s_o[i] = 0.0f;
  __syncthreads();  // an empty split goes straight to the epilogue, which reads s_o

  const int64_t prefix = attention::clamped_prefix(cache_lens[b], p);
  const attention::KeyRange range =
      attention::split_range(prefix + p.tree_keys, p.num_splits, blockIdx.z);
  const T* k_seq = k_cache + b * p.stride_kb + kv_head * p.stride_kh;
  const T* v_seq = v_cache + b * p.stride_kb + kv_head * p.stride_kh;

  RowState state[kWarpRows];
#pragma unroll  // unrolled row loops keep state[] in registers
  for (int i = 0; i < kWarpRows; ++i) state[i] = RowState{-INFINITY, 0.0f};

  for (int64_t block = range.begin; block < range.end; block += kBlockN) {
    const int count = static_cast<int>(range.end - block < kBlockN ? range.end - block : kBlockN);
    if (block + count <= prefix) {
      __syncthreads();  // the previous block's K / V (and the Q / O set-up) are done with
    } else {
      // A block holding tree keys that no row of the tile sees is skipped before its K / V
      // are read (with a chain mask, prefill, that is the half above the diagonal). The vote
      // is also the barrier above.
      bool seen = false;
      for (int e = threadIdx.x; e < kBlockM * kBlockN && !seen; e += kThreads) {
        const int64_t row = row0 + e / kBlockN;
        const int c = e % kBlockN;
        seen = row < rows_total && c < count &&
            attention::key_visible(block + c, prefix,
                                   tree_mask + (b * p.num_queries + row / group) * p.words);
      }
      if (!__syncthreads_or(seen)) continue;
    }
    load_tile<T, D>(s_k, kBlockN, count,
                    [&](int r) -> const T* { return k_seq + (block + r) * p.stride_kn; });
    load_tile<T, D>(s_v, kBlockN, count,
                    [&](int r) -> const T* { return v_seq + (block + r) * p.stride_kn; });
    __syncthreads();

    // S = Q K^T for this warp's 16 rows x 64 keys (K row-major [n][d] is K^T column-major)
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kBlockN / 16];
      for (int n = 0; n < kBlockN / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
      for (int kk = 0; kk < D; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::load_matrix_sync(a, s_q + warp * kWarpRows * L::kLdQ + kk, L::kLdQ);
        for (int n = 0; n < kBlockN / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bk;
          wmma::load_matrix_sync(bk, s_k + n * 16 * L::kLdQ + kk, L::kLdQ);
          wmma::mma_sync(acc[n], a, bk, acc[n]);
        }
      }
      for (int n = 0; n < kBlockN / 16; ++n) {
        wmma::store_matrix_sync(s_s + warp * kWarpRows * L::kLdS + n * 16, acc[n], L::kLdS,
                                wmma::mem_row_major);
      }
    }
    __syncwarp();

    // online softmax, one row at a time across the warp (lane owns keys lane, lane + 32)
    const bool all_prefix = block + count <= prefix;
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i) {
      const int r = warp * kWarpRows + i;
      const int64_t row = row0 + r;
      const int32_t* mask_row =  // recomputed, not kept: 16 pointers would cost 32 registers
          row < rows_total ? tree_mask + (b * p.num_queries + row / group) * p.words : nullptr;
      float logits[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = lane + 32 * j;
        const bool visible = mask_row != nullptr && c < count &&
            (all_prefix || attention::key_visible(block + c, prefix, mask_row));
        logits[j] = visible ? s_s[r * L::kLdS + c] * p.scale_log2 : -INFINITY;
      }
      const float factor = state[i].rescale(warp_max(fmaxf(logits[0], logits[1])));
      const float w0 = state[i].weight(logits[0]);
      const float w1 = state[i].weight(logits[1]);
      state[i].sum += warp_sum(w0 + w1);
      attention::store_as(w0, s_p + r * L::kLdP + lane);
      attention::store_as(w1, s_p + r * L::kLdP + lane + 32);
      for (int d = lane; d < D; d += 32) s_o[r * L::kLdO + d] *= factor;
    }
    __syncwarp();

    // O += P V for this warp's rows, accumulated through shared memory
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      float* o_tile = s_o + warp * kWarpRows * L::kLdO + n * 16;
      wmma::load_matrix_sync(acc, o_tile, L::kLdO, wmma::mem_row_major);
      for (int kk = 0; kk < kBlockN; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bv;
        wmma::load_matrix_sync(a, s_p + warp * kWarpRows * L::kLdP + kk, L::kLdP);
        wmma::load_matrix_sync(bv, s_v + kk * L::kLdQ + n * 16, L::kLdQ);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(o_tile, acc, L::kLdO, wmma::mem_row_major);
    }
  }
  __syncwarp();

#pragma unroll
  for (int i = 0; i < kWarpRows; ++i) {
    const int64_t row = row0 + warp * kWarpRows + i;
    if (row >= rows_total) continue;
    const RowIndex at = row_index(row, group, kv_head);
    const float inverse = state[i].inverse_sum();
    const float* o_row = s_o + (warp * kWarpRows + i) * L::kLdO;
    if (kSplit) {
      const int64_t part =
          ((b * p.num_splits + blockIdx.z) * p.num_queries + at.query) * p.q_heads + at.head;
      for (int d = lane; d < D; d += 32) part_o[part * D + d] = o_row[d] * inverse;
      if (lane == 0) part_lse[part] = state[i].lse();
    } else {
      T* out_row = out + b * p.stride_qb + at.query * p.stride_qn + at.head * p.stride_qh;
      for (int d = lane; d < D; d += 32) attention::store_as(o_row[d] * inverse, out_row + d);
    }
  }
}

/// One CTA per output row (b, query, head) of the contiguous output, head_dim threads.
template <typename T>
__global__ void merge_splits_kernel(const float* __restrict__ part_o,
                                    const float* __restrict__ part_lse, T* __restrict__ out,
                                    int64_t num_splits, int64_t rows_per_batch, int head_dim) {
  __shared__ float weights[attention::kMaxSplits];
  __shared__ float inverse;
  const int64_t x = blockIdx.x;
  const int64_t first = (x / rows_per_batch) * num_splits * rows_per_batch + x % rows_per_batch;
  if (threadIdx.x == 0) inverse = merge_row(part_lse + first, rows_per_batch, num_splits, weights);
  __syncthreads();
  float acc = 0.0f;
  for (int64_t s = 0; s < num_splits; ++s) {
    acc += weights[s] * part_o[(first + s * rows_per_batch) * head_dim + threadIdx.x];
  }
  attention::store_as(acc * inverse, out + x * head_dim + threadIdx.x);
}

template <typename T, int D, bool kSplit>
cudaError_t launch_typed(const void* q, const void* k, const void* v, const int32_t* lens,
                         const int32_t* mask, void* out, float* part_o, float* part_lse,
                         const Problem& p, cudaStream_t stream) {
  auto kernel = tree_attention_kernel<T, D, kSplit>;
  constexpr size_t kBytes = Layout<T, D>::kBytes;
  // Over 48 KB of dynamic shared memory needs an opt-in, once per device: kept out of the
  // launches a CUDA graph captures (the first call of a shape runs eagerly as a warm-up).
  static bool opted_in[kMaxDevices] = {};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (device >= kMaxDevices || !opted_in[device]) {
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
    if (status != cudaSuccess) return status;
    if (device < kMaxDevices) opted_in[device] = true;
  }
  const int64_t group = p.q_heads / p.kv_heads;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.num_queries * group, kBlockM) * p.kv_heads),
                  static_cast<unsigned>(p.batch), static_cast<unsigned>(p.num_splits));
  kernel<<<grid, kThreads, kBytes, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lens, mask,
      static_cast<T*>(out), part_o, part_lse, p);
  if (kSplit) {
    const int64_t rows = p.batch * p.num_queries * p.q_heads;
    merge_splits_kernel<T><<<static_cast<unsigned>(rows), D, 0, stream>>>(
        part_o, part_lse, static_cast<T*>(out), p.num_splits, p.num_queries * p.q_heads, D);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dim(const void* q, const void* k, const void* v, const int32_t* lens,
                       const int32_t* mask, void* out, float* part_o, float* part_lse,
                       const Problem& p, cudaStream_t stream) {
  const bool split = p.num_splits > 1;
  if (p.head_dim == 64) {
    return split ? launch_typed<T, 64, true>(q, k, v, lens, mask, out, part_o, part_lse, p, stream)
                 : launch_typed<T, 64, false>(q, k, v, lens, mask, out, part_o, part_lse, p,
                                              stream);
  }
  return split ? launch_typed<T, 128, true>(q, k, v, lens, mask, out, part_o, part_lse, p, stream)
               : launch_typed<T, 128, false>(q, k, v, lens, mask, out, part_o, part_lse, p,
                                             stream);
}

/// The host twin of one (KV head, sequence, split) for all rows: same split range, same
/// visibility and RowState code, P rounded to T before P V (as the kernel's MMA operand).
template <typename T>
void host_typed(const T* q, const T* k, const T* v, const int32_t* lens, const int32_t* mask,
                T* out, float* part_o, float* part_lse, const Problem& p) {
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t d_size = p.head_dim;
  std::vector<float> o(d_size);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t prefix = attention::clamped_prefix(lens[b], p);
    for (int64_t split = 0; split < p.num_splits; ++split) {
      const attention::KeyRange range =
          attention::split_range(prefix + p.tree_keys, p.num_splits, split);
      for (int64_t kv_head = 0; kv_head < p.kv_heads; ++kv_head) {
        const T* k_seq = k + b * p.stride_kb + kv_head * p.stride_kh;
        const T* v_seq = v + b * p.stride_kb + kv_head * p.stride_kh;
        for (int64_t row = 0; row < p.num_queries * group; ++row) {
          const RowIndex at = row_index(row, group, kv_head);
          const T* q_row = q + b * p.stride_qb + at.query * p.stride_qn + at.head * p.stride_qh;
          const int32_t* mask_row = mask + (b * p.num_queries + at.query) * p.words;
          RowState state{-INFINITY, 0.0f};
          std::fill(o.begin(), o.end(), 0.0f);
          for (int64_t block = range.begin; block < range.end; block += kBlockN) {
            const int64_t count = std::min<int64_t>(kBlockN, range.end - block);
            float logits[kBlockN];
            float block_max = -INFINITY;
            for (int64_t c = 0; c < count; ++c) {
              logits[c] = -INFINITY;
              if (!attention::key_visible(block + c, prefix, mask_row)) continue;
              const T* k_row = k_seq + (block + c) * p.stride_kn;
              float dot = 0.0f;
              for (int64_t d = 0; d < d_size; ++d) dot += to_float(q_row[d]) * to_float(k_row[d]);
              logits[c] = dot * p.scale_log2;
              block_max = std::max(block_max, logits[c]);
            }
            const float factor = state.rescale(block_max);
            for (float& value : o) value *= factor;
            for (int64_t c = 0; c < count; ++c) {
              const float w = state.weight(logits[c]);
              state.sum += w;
              T rounded;
              attention::store_as(w, &rounded);
              const T* v_row = v_seq + (block + c) * p.stride_kn;
              for (int64_t d = 0; d < d_size; ++d) o[d] += to_float(rounded) * to_float(v_row[d]);
            }
          }
          const float inverse = state.inverse_sum();
          if (p.num_splits > 1) {
            const int64_t part =
                ((b * p.num_splits + split) * p.num_queries + at.query) * p.q_heads + at.head;
            for (int64_t d = 0; d < d_size; ++d) part_o[part * d_size + d] = o[d] * inverse;
            part_lse[part] = state.lse();
          } else {
            T* out_row = out + b * p.stride_qb + at.query * p.stride_qn + at.head * p.stride_qh;
            for (int64_t d = 0; d < d_size; ++d) attention::store_as(o[d] * inverse, out_row + d);
          }
        }
      }
    }
  }
  if (p.num_splits == 1) return;
  const int64_t rows_per_batch = p.num_queries * p.q_heads;
  std::vector<float> weights(p.num_splits);
  for (int64_t x = 0; x < p.batch * rows_per_batch; ++x) {
    const int64_t first = (x / rows_per_batch) * p.num_splits * rows_per_batch + x % rows_per_batch;
    const float inverse = merge_row(part_lse + first, rows_per_batch, p.num_splits, weights.data());
    for (int64_t d = 0; d < d_size; ++d) {
      float acc = 0.0f;
      for (int64_t s = 0; s < p.num_splits; ++s) {
        acc += weights[s] * part_o[(first + s * rows_per_batch) * d_size + d];
      }
      attention::store_as(acc * inverse, out + x * d_size + d);
    }
  }
}

}  // namespace

cudaError_t launch_tree_attention(const void* q, const void* k_cache, const void* v_cache,
                                  const int32_t* cache_lens, const int32_t* tree_mask, void* out,
                                  float* part_o, float* part_lse, const attention::Problem& p,
                                  int dtype_code, cudaStream_t stream) {
  if (attention::size_error(p, dtype_code) != nullptr) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      status = launch_dim<T>(q, k_cache, v_cache, cache_lens, tree_mask, out, part_o, part_lse, p,
                             stream);
    }
  });
  return status;
}

void tree_attention_host(const void* q, const void* k_cache, const void* v_cache,
                         const int32_t* cache_lens, const int32_t* tree_mask, void* out,
                         float* part_o, float* part_lse, const attention::Problem& p,
                         int dtype_code) {
  if (attention::size_error(p, dtype_code) != nullptr) return;
  dispatch_dtype(dtype_code, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      host_typed<T>(static_cast<const T*>(q), static_cast<const T*>(k_cache),
                    static_cast<const T*>(v_cache), cache_lens, tree_mask, static_cast<T*>(out),
                    part_o, part_lse, p);
    }
  });
}

}  // namespace eagle_kernels
