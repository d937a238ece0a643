// 8-bit activations: a pass's rows quantized in blocks of 32 (RowsQ8) or 256 (RowsQ8K, for K-quants).
#pragma once

#include "common.h"

namespace {

// Opt-in 8-bit activations (act_q8): before a block projection each row of x is quantized in blocks of 32 as
// llama.cpp's Q8_1 does (d = max |x| / 127, q = round(x / d)) and every block's sum becomes integer dot products,
// which AVX2 multiplies 32 at a time. Lossy against fp32 activations (a different model, measured in docs/speed.md),
// but still the same arithmetic for a row whatever the pass's width, so speculation on it stays exact.
struct RowsQ8 {
  std::vector<int8_t> codes;  // [M, K]
  std::vector<float> d, d_sum;  // [M, K / 32]: the block's scale, and scale * sum of its codes (Q4_1's + m term)
};

// max |x[i]| for i < n (n a multiple of 8)
inline float abs_max(const float* x, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 amax = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// q[0..32) = round(x[i] * inv) as int8; returns their sum
inline int codes32(const float* x, float inv, int8_t* q) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleaving
  __m256i i[4];
  for (int j = 0; j < 4; ++j)
    i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), _mm256_set1_ps(inv)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i total = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t = _mm_hadd_epi32(t, t);
  t = _mm_hadd_epi32(t, t);
  const __m256i packed = _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3])), order);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), packed);
  return _mm_cvtsi128_si32(t);
}

void quantize_q8(const float* x, int64_t K, int8_t* q, float* d, float* d_sum) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const float top = abs_max(x + 32 * b, 32);
    const int total = codes32(x + 32 * b, top > 0.f ? 127.f / top : 0.f, q + 32 * b);
    d[b] = top / 127.f;
    d_sum[b] = d[b] * float(total);
  }
}

// x [M, K]'s rows quantized into xq, each in blocks of 32
void quantize_rows(const float* x, int64_t M, int64_t K, RowsQ8& xq) {
  const int64_t blocks = K / 32;
  xq.codes.resize(M * K);
  xq.d.resize(M * blocks);
  xq.d_sum.resize(M * blocks);
  for (int64_t r = 0; r < M; ++r)
    quantize_q8(x + r * K, K, xq.codes.data() + r * K, xq.d.data() + r * blocks, xq.d_sum.data() + r * blocks);
}

// K-quant projections' 8-bit activations, as llama.cpp's Q8_K: one scale per 256 inputs (d = max |x| / 127), so a
// K-quant block's 256 integer products sum as integers before one float step, and each 32's code sum (the mins'
// term, summed against the block's 8 mins as integers too). Coarser than the 32-input blocks above; the same for a
// row whatever the pass's width.
struct RowsQ8K {
  std::vector<int8_t> codes;  // [M, K]
  std::vector<float> d;       // [M, K / 256]
  std::vector<int16_t> sums;  // [M, K / 32]
};

void quantize_q8k(const float* x, int64_t K, int8_t* q, float* d, int16_t* sums) {
  for (int64_t b = 0; b < K / 256; ++b) {
    const float top = abs_max(x + 256 * b, 256), inv = top > 0.f ? 127.f / top : 0.f;
    for (int j = 0; j < 8; ++j) sums[8 * b + j] = int16_t(codes32(x + 256 * b + 32 * j, inv, q + 256 * b + 32 * j));
    d[b] = top / 127.f;
  }
}

// x [M, K]'s rows quantized into xk as Q8_K
void quantize_rows(const float* x, int64_t M, int64_t K, RowsQ8K& xk) {
  xk.codes.resize(M * K), xk.d.resize(M * (K / 256)), xk.sums.resize(M * (K / 32));
  for (int64_t r = 0; r < M; ++r)
    quantize_q8k(x + r * K, K, xk.codes.data() + r * K, xk.d.data() + r * (K / 256), xk.sums.data() + r * (K / 32));
}

}  // namespace
