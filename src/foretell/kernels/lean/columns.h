// Kinds BF16X and I8X on AVX2: 16 output columns interleaved, float activations.
#pragma once

#include "common.h"
#include "columns_avx512.h"

namespace {

// BF16X and I8X: 16 output columns interleaved, [N / 16, K, 16]: for each input k the 16 columns' weights side by
// side. Each row's x[k] is broadcast and one FMA advances 8 columns: no horizontal sums, and the weights' widening
// is paid once for all R rows. A row's sums run over k in one fixed order whatever R (I8X: then times the column's
// scale).
// next: the following group's weights (nullptr: none), fetched into L2 meanwhile (with the hardware prefetcher
// alone a one-token step of SmolLM2-135M took ~10% longer on a 2-core EPYC). A pass streams each weight once
// however many rows it carries, and the products of a few rows hide under the weights' arrival.
template <int R, bool INT8>
void group_x16(const Proj& p, int64_t g, const float* x, float* y, int64_t y_stride, const void* next) {
  static_assert(R >= 1 && R <= 6, "12 sums, two weights, a broadcast and zero (or the codes) fill 16 registers");
  constexpr int64_t bytes = INT8 ? 16 : 32;  // one input's 16 weights
  const uint8_t* w = (INT8 ? p.codes : reinterpret_cast<const uint8_t*>(p.half)) + g * p.K * bytes;
  const int64_t K = p.K;
  // named accumulators, not arrays: GCC 12 kept arrays of them in memory, storing each one every k
  __m256 l0 = _mm256_setzero_ps(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0, l4 = l0, h4 = l0,
         l5 = l0, h5 = l0;
  const __m256i zero = _mm256_setzero_si256();
  const int64_t line_every = 64 / bytes;  // inputs a 64-byte line of the next group holds
  for (int64_t k = 0; k < K; ++k) {
    if (next && k % line_every == 0)
      _mm_prefetch(static_cast<const char*>(next) + bytes * k, _MM_HINT_T1);
    __m256 w0, w1;
    if constexpr (INT8) {  // 16 codes: sign-extended and converted, columns 0..7 and 8..15
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + bytes * k));
      w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
      w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8)));
    } else {  // one load, two unpacks: a bf16 below 16 zero bits is its fp32 (the packer ordered the 16 so that
              // these are columns 0..7 and 8..15)
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + bytes * k));
      w0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw));
      w1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw));
    }
#define FORETELL_X16_ROW(r)                                    \
  if constexpr (R > r) {                                       \
    const __m256 xr = _mm256_broadcast_ss(x + r * K + k);      \
    l##r = _mm256_fmadd_ps(xr, w0, l##r);                      \
    h##r = _mm256_fmadd_ps(xr, w1, h##r);                      \
  }
    FORETELL_X16_ROW(0) FORETELL_X16_ROW(1) FORETELL_X16_ROW(2)
    FORETELL_X16_ROW(3) FORETELL_X16_ROW(4) FORETELL_X16_ROW(5)
#undef FORETELL_X16_ROW
  }
  __m256 lo[6] = {l0, l1, l2, l3, l4, l5}, hi[6] = {h0, h1, h2, h3, h4, h5};
  if constexpr (INT8) {
    const __m256 s0 = _mm256_loadu_ps(p.scales + 16 * g), s1 = _mm256_loadu_ps(p.scales + 16 * g + 8);
    for (int r = 0; r < R; ++r) lo[r] = _mm256_mul_ps(lo[r], s0), hi[r] = _mm256_mul_ps(hi[r], s1);
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(y + r * y_stride + 16 * g, lo[r]);
    _mm256_storeu_ps(y + r * y_stride + 16 * g + 8, hi[r]);
  }
}

// y [M, N] = x [M, K] W^T (+ bias) for BF16X or I8X (INT8) columns: groups of 16 columns over torch's threads, x's
// rows in passes of at most 6 (AVX2) or 16 (AVX-512, columns_avx512.h)
template <bool INT8>
void gemm_columns(const Proj& p, const float* x, int64_t M, float* y, float*, bool) {
  const uint8_t* base = INT8 ? p.codes : reinterpret_cast<const uint8_t*>(p.half);
  const int64_t group_bytes = p.K * (INT8 ? 16 : 32);
  at::parallel_for(0, p.N / 16, 4, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const void* next = g + 1 < p.N / 16 ? base + (g + 1) * group_bytes : nullptr;
      if (avx512_on)
        in_passes<16>(M, [&](auto R, int64_t m) {
          group_x16_avx512<decltype(R)::value, INT8>(p, g, x + m * p.K, y + m * p.N, p.N, next);
        });
      else
        in_passes<6>(M, [&](auto R, int64_t m) {
          group_x16<decltype(R)::value, INT8>(p, g, x + m * p.K, y + m * p.N, p.N, next);
        });
      if (p.bias)
        for (int64_t r = 0; r < M; ++r)
          for (int64_t n = 16 * g; n < 16 * g + 16; ++n) y[r * p.N + n] += p.bias[n];
    }
  });
}

void unpack_bf16x(Proj& p, const torch::Tensor& main, const torch::Tensor&) {  // [N / 16, K, 16]
  TORCH_CHECK(main.dim() == 3 && main.size(2) == 16, "interleaved bf16 weight's shape");
  p.N = main.size(0) * 16;
  p.K = main.size(1);
  p.half = reinterpret_cast<const uint16_t*>(main.data_ptr<at::BFloat16>());
}

void unpack_i8x(Proj& p, const torch::Tensor& main, const torch::Tensor& scales) {  // [N / 16, K, 16]
  TORCH_CHECK(main.dim() == 3 && main.size(2) == 16, "interleaved int8 weight's shape");
  p.N = main.size(0) * 16;
  p.K = main.size(1);
  p.codes = reinterpret_cast<const uint8_t*>(main.data_ptr<int8_t>());
  p.scales = scales.data_ptr<float>();
}

}  // namespace
