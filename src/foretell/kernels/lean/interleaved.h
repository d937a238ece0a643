// Kinds Q4X and Q8X: Q4_1 / Q8_0 blocks with 8 output columns interleaved, 8-bit activations (AVX2 and
// AVX-512 VNNI), and the prefetch of the interleaved kinds.
#pragma once

#include "common.h"
#include "act_q8.h"
#include "vnni.h"

namespace {

// Column-interleaved blocks (Q4X, Q8X; 8-bit activations only). A 256-bit register holds 4 consecutive codes of
// each of 8 output columns, and the activation's matching 4 codes are broadcast to all 8 lanes: one maddubs then
// advances 8 columns' sums at once, and a block's scaling (cvt, scale, fma) is paid once per 8 columns instead of
// once per column with a horizontal sum at the end, as the row layout (rows.h) does. Codes for a group of 8 columns
// g and block b (runtime/lean_step.interleaved writes them):
//   Q4X: 4 vectors of 32 bytes; in vector j, lane c's byte i holds column c's code for input 4j + i in its low
//        nibble and for input 16 + 4j + i in its high nibble
//   Q8X: 8 vectors of 32 bytes; in vector j, lane c's byte i is column c's code for input 4j + i
// A block's integer sums are exact, and the float steps per block are in a fixed order, so a row's result does
// not depend on the rows beside it.
inline __m256i spread4(const int8_t* q) {  // 4 activation codes, in every 32-bit lane
  int32_t v;
  std::memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}

// A block's integer sums for R rows (q: each row's 32 codes of the block): sums[r] = 8 columns' int32 sums. The
// VNNI versions are inlined where the caller has that instruction set (the *_vnni entry points below).

// 128 bytes of 4-bit codes, 4 vectors each holding 8 columns' codes of inputs 4v..4v+3 (low nibbles) and
// 16+4v..16+4v+3 (high), against each row's 32 activation codes at a[r] + offset: sums[r] = 8 columns' int32 sums (Q4X blocks, KQ4X
// chunks). A row's eight products add as a tree, not one chain: a chain of eight dependent adds a block held each
// row back (in-cache products of 4-64 rows: 65-69 -> 75-79 GMAC/s on one Zen 3 core, experiments/q4x_rows.py).
template <int R>
__attribute__((always_inline)) inline void nibble_sums_avx2(const uint8_t* codes, const int8_t* const* a,
                                                            int64_t offset, __m256i* sums) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256i lo[4], hi[4];
  for (int v = 0; v < 4; ++v) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * v));
    lo[v] = _mm256_and_si256(raw, low4);
    hi[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
  }
  for (int r = 0; r < R; ++r) {
    __m256i part[4];
    for (int v = 0; v < 4; ++v)
      part[v] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[v], spread4(a[r] + offset + 4 * v)),
                                 _mm256_maddubs_epi16(hi[v], spread4(a[r] + offset + 16 + 4 * v)));
    sums[r] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(part[0], part[1]), _mm256_add_epi16(part[2], part[3])),
                                ones);
  }
}

template <int R>
__attribute__((always_inline)) inline void q4x_sums_avx2(const uint8_t* block, const int8_t* const* q, __m256i* sums) {
  // 8 codes of at most 15 times |activation| <= 127, two per 16-bit lane: 8 * 2 * 15 * 127 < 2^15, and every partial
  // sum of the tree is a sum of some of those products: no overflow
  nibble_sums_avx2<R>(block, q, 0, sums);
}

template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) inline void q4x_sums_vnni(
    const uint8_t* block, const int8_t* const* q, __m256i* sums) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int r = 0; r < R; ++r) sums[r] = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * j));
    const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    for (int r = 0; r < R; ++r) {
      sums[r] = _mm256_dpbusd_epi32(sums[r], lo, spread4(q[r] + 4 * j));
      sums[r] = _mm256_dpbusd_epi32(sums[r], hi, spread4(q[r] + 16 + 4 * j));
    }
  }
}

template <int R>
__attribute__((always_inline)) inline void q8x_sums_avx2(const uint8_t* block, const int8_t* const* q, __m256i* sums) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) sums[r] = _mm256_setzero_si256();
  for (int half = 0; half < 2; ++half) {  // 4 chunks at a time, their products added as a tree (q4x_sums_avx2)
    __m256i w[4], magnitude[4];
    for (int j = 0; j < 4; ++j) {
      w[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * (4 * half + j)));
      magnitude[j] = _mm256_sign_epi8(w[j], w[j]);  // |w| as unsigned, its sign moved onto the activations
    }
    for (int r = 0; r < R; ++r) {
      __m256i part[4];
      for (int j = 0; j < 4; ++j)
        part[j] = _mm256_madd_epi16(
            _mm256_maddubs_epi16(magnitude[j], _mm256_sign_epi8(spread4(q[r] + 4 * (4 * half + j)), w[j])), ones);
      sums[r] = _mm256_add_epi32(sums[r], _mm256_add_epi32(_mm256_add_epi32(part[0], part[1]),
                                                           _mm256_add_epi32(part[2], part[3])));
    }
  }
}

template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) inline void q8x_sums_vnni(
    const uint8_t* block, const int8_t* const* q, __m256i* sums) {
  for (int r = 0; r < R; ++r) sums[r] = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * j));
    const __m256i magnitude = _mm256_sign_epi8(w, w);
    for (int r = 0; r < R; ++r)
      sums[r] = _mm256_dpbusd_epi32(sums[r], magnitude, _mm256_sign_epi8(spread4(q[r] + 4 * j), w));
  }
}

// The interleaved kinds' products read a group of 8 columns' blocks front to back, group after group, and fetch the
// group `prefetch_groups` ahead while this one multiplies: a product streamed alone from memory had paid for the
// weights' arrival and its dot products one after the other. Whole passes, whose layers' products are small,
// measured within noise of the hardware prefetcher alone (benchmarks/experiments/pass_widths.py --prefetch 0,2).
// lean_prefetch sets it (0: off); the arithmetic is the same either way.
int64_t prefetch_groups = 2;

int64_t lean_prefetch(int64_t groups) {
  TORCH_CHECK(groups >= 0, "groups ahead: 0 or more");
  return prefetch_groups = groups;
}

// whether the pass over rows m.. of group g (of `groups`) fetches the later group: the first rows' pass does
inline bool fetches(int64_t m, int64_t g, int64_t groups) {
  return m == 0 && prefetch_groups > 0 && g + prefetch_groups < groups;
}

// bytes [p, p + n) on their way to the cache (n > 0)
inline void fetch_ahead(const void* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 64) _mm_prefetch(static_cast<const char*>(p) + i, _MM_HINT_T0);
}

// Columns 8g .. 8g + 7 of R rows of Q4X (Q4) or Q8X blocks: per block the integer sums, then the block's scales
template <int R, bool Q4, bool VNNI>
__attribute__((always_inline)) inline void group_qx(const Proj& p, int64_t g, const RowsQ8& x, int64_t m, float* y,
                                                    int64_t y_stride) {
  const int64_t blocks = p.K / 32, block_bytes = Q4 ? 128 : 256, scales_a_block = Q4 ? 16 : 8;
  const uint8_t* codes = p.codes + g * blocks * block_bytes;
  const float* scales = p.scales + g * blocks * scales_a_block;
  const bool fetch = fetches(m, g, p.N / 8);
  const uint8_t* later_codes = codes + prefetch_groups * blocks * block_bytes;
  const float* later_scales = scales + prefetch_groups * blocks * scales_a_block;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    if (fetch) {
      fetch_ahead(later_codes + b * block_bytes, block_bytes);
      fetch_ahead(later_scales + b * scales_a_block, scales_a_block * 4);
    }
    const int8_t* q[R];
    for (int r = 0; r < R; ++r) q[r] = x.codes.data() + ((m + r) * blocks + b) * 32;
    __m256i sums[R];
    if constexpr (Q4 && VNNI) q4x_sums_vnni<R>(codes + b * block_bytes, q, sums);
    else if constexpr (Q4) q4x_sums_avx2<R>(codes + b * block_bytes, q, sums);
    else if constexpr (VNNI) q8x_sums_vnni<R>(codes + b * block_bytes, q, sums);
    else q8x_sums_avx2<R>(codes + b * block_bytes, q, sums);
    const __m256 d = _mm256_loadu_ps(scales + b * scales_a_block);
    for (int r = 0; r < R; ++r) {
      const int64_t row = (m + r) * blocks + b;
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), _mm256_mul_ps(d, _mm256_set1_ps(x.d[row])), acc[r]);
      if constexpr (Q4) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(scales + b * 16 + 8), _mm256_set1_ps(x.d_sum[row]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * y_stride + 8 * g, acc[r]);
}

template <int R>
void group_q4x(const Proj& p, int64_t g, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  group_qx<R, true, false>(p, g, x, m, y, y_stride);
}

template <int R>
void group_q8x(const Proj& p, int64_t g, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  group_qx<R, false, false>(p, g, x, m, y, y_stride);
}

template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) void group_q4x_vnni(
    const Proj& p, int64_t g, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  group_qx<R, true, true>(p, g, x, m, y, y_stride);
}

template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) void group_q8x_vnni(
    const Proj& p, int64_t g, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  group_qx<R, false, true>(p, g, x, m, y, y_stride);
}

// The interleaved kinds' products (Q4X, Q8X, KQ4X, KQ6X): y [M, N]'s groups of 8 columns over torch's threads,
// group(g) writing columns 8g .. 8g + 7 of y's M rows, then the bias added to them
template <class Group>
void over_groups(const Proj& p, int64_t M, float* y, Group group) {
  at::parallel_for(0, p.N / 8, 8, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      group(g);
      if (p.bias)
        for (int64_t r = 0; r < M; ++r)
          for (int64_t n = 8 * g; n < 8 * g + 8; ++n) y[r * p.N + n] += p.bias[n];
    }
  });
}

// y [M, N] = x [M, K] W^T (+ bias) for Q4X (Q4) or Q8X blocks, x's rows quantized in blocks of 32: groups of 8
// columns over torch's threads, x's rows 8 at a time (VNNI) or 4
template <bool Q4>
void gemm_interleaved(const Proj& p, const float* x, int64_t M, float* y, float*, bool act_q8) {
  TORCH_CHECK(act_q8, "interleaved blocks run with 8-bit activations only");
  RowsQ8 xq;
  quantize_rows(x, M, p.K, xq);
  over_groups(p, M, y, [&](int64_t g) {
    if (vnni_on && Q4)
      in_eights(M, [&](auto R, int64_t m) { group_q4x_vnni<decltype(R)::value>(p, g, xq, m, y + m * p.N, p.N); });
    else if (vnni_on)
      in_eights(M, [&](auto R, int64_t m) { group_q8x_vnni<decltype(R)::value>(p, g, xq, m, y + m * p.N, p.N); });
    else if (Q4)
      in_fours(M, [&](auto R, int64_t m) { group_q4x<decltype(R)::value>(p, g, xq, m, y + m * p.N, p.N); });
    else
      in_fours(M, [&](auto R, int64_t m) { group_q8x<decltype(R)::value>(p, g, xq, m, y + m * p.N, p.N); });
  });
}

// Q4X / Q8X blocks: codes [N / 8, K / 32, 128 or 256], scales as lean_decode.cpp's top says
template <bool Q4>
void unpack_interleaved(Proj& p, const torch::Tensor& main, const torch::Tensor& scales) {
  TORCH_CHECK(main.dim() == 3 && main.size(2) == (Q4 ? 128 : 256), "interleaved blocks' shape");
  p.N = main.size(0) * 8;
  p.K = main.size(1) * 32;
  p.codes = static_cast<const uint8_t*>(main.data_ptr());
  p.scales = scales.data_ptr<float>();
}

}  // namespace
