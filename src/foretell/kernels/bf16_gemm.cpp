// y[M, N] = x[M, K] @ w[N, K]^T for a few rows M: x float32, w bfloat16, y float32, accumulated in float32.
//
// On x86 CPUs without a native bf16 matrix multiply (AVX2, no AVX512-BF16 / AMX), PyTorch's bf16 product of
// several rows is emulated and grows linearly with the rows, and the fp32 product reads twice the bytes. This
// kernel streams the bf16 weight once (widening 8 values at a time: a bf16 is the top half of an fp32) and
// multiplies it into up to 4 rows of x per load, with 2 output rows at a time: 8 accumulators in registers.
// So a pass of 2-32 rows (a verification tree) costs little more than reading the weight. Built on first use by
// foretell/kernels/__init__.py; foretell falls back to PyTorch's products where it cannot be built.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstring>

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

inline __m256 widen8(const uint16_t* p) {  // 8 bf16 -> 8 fp32, exactly
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float widen1(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Rows m0..m0+R-1 of x (R <= 4) against weight rows n0..n0+C-1 (C <= 2), K8 = K rounded down to 8.
template <int R, int C>
inline void block(const float* X, const uint16_t* W, float* Y, int64_t K, int64_t N, int64_t m0, int64_t n0) {
  const int64_t K8 = K & ~int64_t(7);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 w[C];
    for (int c = 0; c < C; ++c) w[c] = widen8(W + (n0 + c) * K + k);
    for (int r = 0; r < R; ++r) {
      __m256 x = _mm256_loadu_ps(X + (m0 + r) * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(x, w[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t k = K8; k < K; ++k) s += X[(m0 + r) * K + k] * widen1(W[(n0 + c) * K + k]);
      Y[(m0 + r) * N + n0 + c] = s;
    }
}

template <int C>
inline void column(const float* X, const uint16_t* W, float* Y, int64_t M, int64_t K, int64_t N, int64_t n0) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) block<4, C>(X, W, Y, K, N, m, n0);
  switch (M - m) {
    case 3: block<3, C>(X, W, Y, K, N, m, n0); break;
    case 2: block<2, C>(X, W, Y, K, N, m, n0); break;
    case 1: block<1, C>(X, W, Y, K, N, m, n0); break;
    default: break;
  }
}

}  // namespace

torch::Tensor bf16_small_gemm(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K] expected");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kBFloat16, "x float32 and w bfloat16 expected");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options());
  const float* X = x.data_ptr<float>();
  const uint16_t* W = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, (N + 1) / 2, 8, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t n0 = 2 * pair;
      if (n0 + 1 < N) column<2>(X, W, Y, M, K, N, n0);
      else column<1>(X, W, Y, M, K, N, n0);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bf16_small_gemm", &bf16_small_gemm, "x fp32 [M, K] @ w bf16 [N, K]^T -> fp32 [M, N]");
}
