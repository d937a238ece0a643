// A pass of a few tokens (a one-token decode step, a verification pass) of a Llama-shaped model in a single native
// call: every layer's norms, projections, rotary embedding, cache writes, attention, MLP and the output layer, in
// fp32 activations.
//
// Why: in eager PyTorch a one-token step of a small model issues ~20 operations a layer, each with a few
// microseconds of dispatch and a temporary tensor; on a 2-core CPU that overhead cost as much as streaming the
// 4-bit weights themselves. Here the only per-layer costs are reading the weights and a handful of OpenMP
// regions. The arithmetic is the PyTorch path's (models/transformer.py) in fp32, so a lean step and a PyTorch
// pass over the same weights agree up to summation order, as passes of different widths already do.
//
// Projection weights come in these kinds (runtime/lean_step.py packs them):
//   Q4: GGUF Q4_1 blocks of 32 inputs: codes uint8 [N, K / 2] (byte j of a block holds input j in its low nibble
//       and input j + 16 in its high nibble), dm float [N, K / 32, 2] = (d, m), w = d * code + m
//   Q8: GGUF Q8_0 blocks of 32 inputs: codes int8 [N, K], d float [N, K / 32], w = d * code
//   F32: a dense float weight [N, K]
//   BF16: a dense bfloat16 weight [N, K] (a bf16 is the top half of an fp32: widened exactly in registers), half
//         F32's bytes for the same values where a float32 model's weights are bf16 numbers
//   BF16X: the same with 16 output columns interleaved, [N / 16, K, 16] (lean_step.bf16_interleaved; group_x16)
//   I8X: int8 weights with a scale per output column (a drafter's int8 layers, quant.Int8Linear), 16 output columns
//        interleaved: codes int8 [N / 16, K, 16], scales float [N] (Int8Linear.columns16; group_x16)
//   BF16A: a bf16 model's weight (bf16 products: activations rounded to bf16, fp32 sums) in AMX's tile layout,
//          [N / 16, K / 2, 32]: per 16 output columns and pair of inputs, the columns' two weights side by side
//          (lean_step.amx_tiles; tiles_amx)
// and, with 8-bit activations only, the same blocks with 8 output columns interleaved (lean_step.interleaved;
// group_q4x below says how):
//   Q4X: codes uint8 [N / 8, K / 32, 128], scales float [N / 8, K / 32, 2, 8] (the 8 columns' d, then their m)
//   Q8X: codes int8 [N / 8, K / 32, 256], scales float [N / 8, K / 32, 8]
//   KQ4X: a GGUF projection all in Q4_K blocks, 8 output columns interleaved (8-bit activations only; the K-quant
//         section below: interleave_q4k)
//   KQ6X: the same for a projection all in Q6_K blocks (interleave_q6k)
//   GGUF: a GGUF file's blocks as it ships them, bytes uint8 [total] and a layout int64 [1 + 2 P]: K, then each
//         part's (ggml type, rows); the parts' rows follow one another (a fused q, k, v may mix Q4_K and Q6_K, as
//         llama.cpp's Q4_K_M files do). Types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (the GGUF section below)
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

enum Kind : int64_t { Q4 = 0, Q8 = 1, F32 = 2, Q4X = 3, Q8X = 4, BF16 = 5, BF16X = 6, I8X = 7, BF16A = 8, GGUF = 9,
                      KQ4X = 10, KQ6X = 11 };

// One part of a GGUF projection: its rows first .. first + rows - 1, each row_bytes of the file's blocks from base
struct GgufPart {
  int64_t type, first, rows, row_bytes;
  const uint8_t* base;
};
constexpr int64_t GGUF_MAX_PARTS = 8;

struct Proj {
  int64_t kind, N, K;
  const uint8_t* codes = nullptr;  // Q4, Q8, I8X
  const float* scales = nullptr;   // Q4: dm pairs; Q8: d; I8X: a scale per output column
  const float* dense = nullptr;    // F32
  const uint16_t* half = nullptr;  // BF16, BF16X, BF16A
  const float* bias = nullptr;     // optional [N]
  GgufPart parts[GGUF_MAX_PARTS];  // GGUF
  int64_t n_parts = 0;

  const GgufPart& part_of(int64_t n) const {  // the GGUF part holding output row n
    int64_t i = 0;
    while (n >= parts[i].first + parts[i].rows) ++i;
    return parts[i];
  }
};

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// e^x for 8 floats: x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series to r^7 (relative error ~1e-8,
// below float rounding), times 2^n built in the exponent bits. Inputs are clamped to [-80, 88], and below -80 the
// result is 0: e^-80 ~ 2e-35 is lost in any sum with softmax's largest term (1) or in SiLU's 1 + e^-g, while the
// values near e^-87 this once returned were denormal floats, each product with them ~100x slower (a one-token
// step over a context full of such keys took 180 ms instead of 8; docs/speed.md).
// The scalar std::exp cost ~2 ms a token in softmax and SiLU at 256 tokens of context.
inline __m256 exp8(__m256 x) {
  const __m256 kept = _mm256_cmp_ps(x, _mm256_set1_ps(-80.0f), _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-80.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);  // ln 2 in two parts: r stays exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(scale)), kept);
}

// v[i] = e^(v[i] - shift) for i < n
inline void exp_shifted(float* v, int64_t n, float shift) {
  const int64_t n8 = n & ~int64_t(7);
  const __m256 sh = _mm256_set1_ps(shift);
  for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(v + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), sh)));
  if (n > n8) {
    float tail[8] = {0};
    std::copy(v + n8, v + n, tail);
    _mm256_storeu_ps(tail, exp8(_mm256_sub_ps(_mm256_loadu_ps(tail), sh)));
    std::copy(tail, tail + (n - n8), v + n8);
  }
}

inline __m256 bytes_u8(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }
inline __m256 bytes_i8(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }

// Sum over x's 32-value blocks, for Q4_1's "+ m" term: x_sums[b] = sum of x[32 b .. 32 b + 31].
void block_sums(const float* x, int64_t K, float* out) {
  for (int64_t b = 0; b < K / 32; ++b) {
    __m256 s = _mm256_loadu_ps(x + 32 * b);
    for (int j = 8; j < 32; j += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(x + 32 * b + j));
    out[b] = hsum(s);
  }
}

// sum over a block's 32 inputs xb[i] * q_i, q_i in four vectors of 8
inline __m256 block_dot(const float* xb, __m256 q0, __m256 q1, __m256 q2, __m256 q3) {
  __m256 s = _mm256_mul_ps(_mm256_loadu_ps(xb), q0);
  s = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), q1, s);
  s = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), q2, s);
  return _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), q3, s);
}

// Output row n of a Q4 projection for R rows of x at once (the block's codes unpacked once for all R): every row
// gets exactly the arithmetic of R = 1, so a one-token step and a wider pass compute the same sums.
template <int R>
void rows_q4(const Proj& p, int64_t n, const float* x, const float* x_sums, float* y, int64_t y_stride) {
  const int64_t blocks = p.K / 32;
  const uint8_t* codes = p.codes + n * (p.K / 2);
  const float* dm = p.scales + n * blocks * 2;
  const __m128i low4 = _mm_set1_epi8(0x0F);
  __m256 acc[R];
  float offsets[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), offsets[r] = 0.f;
  for (int64_t b = 0; b < blocks; ++b) {
    __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * b));
    __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    const __m256 q0 = bytes_u8(lo), q1 = bytes_u8(_mm_srli_si128(lo, 8));
    const __m256 q2 = bytes_u8(hi), q3 = bytes_u8(_mm_srli_si128(hi, 8));
    const __m256 d = _mm256_set1_ps(dm[2 * b]);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(d, block_dot(x + r * p.K + 32 * b, q0, q1, q2, q3), acc[r]);
      offsets[r] += dm[2 * b + 1] * x_sums[r * blocks + b];
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride + n] = hsum(acc[r]) + offsets[r];
}

template <int R>
void rows_q8(const Proj& p, int64_t n, const float* x, float* y, int64_t y_stride) {
  const int64_t blocks = p.K / 32;
  const int8_t* codes = reinterpret_cast<const int8_t*>(p.codes) + n * p.K;
  const float* d = p.scales + n * blocks;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 32 * b));
    __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 32 * b + 16));
    const __m256 q0 = bytes_i8(c0), q1 = bytes_i8(_mm_srli_si128(c0, 8));
    const __m256 q2 = bytes_i8(c1), q3 = bytes_i8(_mm_srli_si128(c1, 8));
    const __m256 db = _mm256_set1_ps(d[b]);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(db, block_dot(x + r * p.K + 32 * b, q0, q1, q2, q3), acc[r]);
  }
  for (int r = 0; r < R; ++r) y[r * y_stride + n] = hsum(acc[r]);
}

float row_f32(const Proj& p, int64_t n, const float* x) {
  const float* w = p.dense + n * p.K;
  const int64_t K8 = p.K & ~int64_t(7);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), acc);
  float s = hsum(acc);
  for (int64_t k = K8; k < p.K; ++k) s += x[k] * w[k];
  return s;
}

inline __m256 widen_bf16(const uint16_t* w) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline float bf16_value(uint16_t w) {
  const uint32_t bits = uint32_t(w) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Output column n of a BF16 projection for R rows: each row sums in two chains (even and odd groups of 8 inputs,
// so that one row alone is not bound by the FMA latency), the same for every R.
template <int R>
void rows_bf16(const Proj& p, int64_t n, const float* x, float* y, int64_t y_stride) {
  const uint16_t* w = p.half + n * p.K;
  const int64_t K16 = p.K & ~int64_t(15), K8 = p.K & ~int64_t(7);
  __m256 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = _mm256_setzero_ps(), odd[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K16; k += 16) {
    const __m256 w0 = widen_bf16(w + k), w1 = widen_bf16(w + k + 8);
    for (int r = 0; r < R; ++r) {
      even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * p.K + k), w0, even[r]);
      odd[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * p.K + k + 8), w1, odd[r]);
    }
  }
  if (K8 > K16) {
    const __m256 w0 = widen_bf16(w + K16);
    for (int r = 0; r < R; ++r) even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * p.K + K16), w0, even[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(_mm256_add_ps(even[r], odd[r]));
    for (int64_t k = K8; k < p.K; ++k) s += x[r * p.K + k] * bf16_value(w[k]);
    y[r * y_stride + n] = s;
  }
}

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

// The same products on AVX-512 (where the CPU has it): one 16-lane FMA per row and input where AVX2 needs two, and
// 32 registers, so up to 16 rows share one pass over the weights. Every column's sum is the same chain of FMAs over
// k as group_x16's, so both give the same bits (lean_avx512 switches, for that test). BF16X's packing order
// (columns 0-3, 8-11, 4-7, 12-15, for AVX2's in-lane unpacks) is undone once, at the store.
bool avx512_on = __builtin_cpu_supports("avx512f");

template <int R, bool INT8>
__attribute__((target("avx512f"))) void group_x16_avx512(const Proj& p, int64_t g, const float* x, float* y,
                                                          int64_t y_stride, const void* next) {
  static_assert(R >= 1 && R <= 16, "16 sums, the weights and a broadcast");
  constexpr int64_t bytes = INT8 ? 16 : 32;
  const uint8_t* w = (INT8 ? p.codes : reinterpret_cast<const uint8_t*>(p.half)) + g * p.K * bytes;
  const int64_t K = p.K;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
         a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  const int64_t line_every = 64 / bytes;
  for (int64_t k = 0; k < K; ++k) {
    if (next && k % line_every == 0)
      _mm_prefetch(static_cast<const char*>(next) + bytes * k, _MM_HINT_T1);
    __m512 wk;
    if constexpr (INT8)
      wk = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + bytes * k))));
    else
      wk = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + bytes * k))), 16));
#define FORETELL_X16_ROW512(r) \
  if constexpr (R > r) a##r = _mm512_fmadd_ps(_mm512_set1_ps(x[r * K + k]), wk, a##r);
    FORETELL_X16_ROW512(0) FORETELL_X16_ROW512(1) FORETELL_X16_ROW512(2) FORETELL_X16_ROW512(3)
    FORETELL_X16_ROW512(4) FORETELL_X16_ROW512(5) FORETELL_X16_ROW512(6) FORETELL_X16_ROW512(7)
    FORETELL_X16_ROW512(8) FORETELL_X16_ROW512(9) FORETELL_X16_ROW512(10) FORETELL_X16_ROW512(11)
    FORETELL_X16_ROW512(12) FORETELL_X16_ROW512(13) FORETELL_X16_ROW512(14) FORETELL_X16_ROW512(15)
#undef FORETELL_X16_ROW512
  }
  const __m512 acc[16] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15};
  const __m512i order = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  const __m512 scales = INT8 ? _mm512_loadu_ps(p.scales + 16 * g) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    const __m512 v = INT8 ? _mm512_mul_ps(acc[r], scales) : _mm512_permutexvar_ps(order, acc[r]);
    _mm512_storeu_ps(y + r * y_stride + 16 * g, v);
  }
}

bool lean_avx512(bool on) {
  avx512_on = on && __builtin_cpu_supports("avx512f");
  return avx512_on;
}

// BF16A on AMX (Intel's tile unit, where the CPU has it and Linux grants the tile state): a bf16 model's products
// as bf16 matrix products do them, activations rounded to bf16 (to nearest even) and fp32 sums, 16 rows by 16
// columns by 32 inputs an instruction. A tile's element sums its row's inputs in an order that does not depend on
// the tile's other rows, and the 32-input chunks come in one fixed order, so a row gets the same bits whatever the
// pass's width; with ~16x the products of AVX-512's FMAs a cycle, the products of a 16-row pass cost about what
// streaming the weights once does (docs/speed.md has the whole passes' timings).
// Compilers without AMX intrinsics (GCC < 11, Clang < 12), and systems other than Linux (which grants the tile state
// through arch_prctl), build the rest: BF16A then is never packed.
#if defined(__linux__) && \
    ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12))
#define FORETELL_AMX 1
bool amx_granted() {
  __builtin_cpu_init();  // this runs among the library's static initialisers, maybe before libgcc's own
  static const bool granted = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
                              syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
}

bool amx_on = amx_granted();

bool lean_amx(bool on) {
  amx_on = on && amx_granted();
  return amx_on;
}

struct TileConfig {  // ldtilecfg's 64 bytes, palette 1
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline uint16_t bf16_rounded(float f) {  // round to nearest even (no NaNs reach a projection)
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// x[0..n) rounded to bf16 (bf16_rounded's arithmetic, 16 at a time)
__attribute__((target("avx512f"))) void to_bf16(const float* x, int64_t n, uint16_t* out) {
  const int64_t n16 = n & ~int64_t(15);
  const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
  for (int64_t i = 0; i < n16; i += 16) {
    const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(x + i));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(half, odd)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(rounded));
  }
  for (int64_t i = n16; i < n; ++i) out[i] = bf16_rounded(x[i]);
}

// The first `rows` rows of a 16x16 tile stored in `scratch` into y at column 16g (a pass's padding rows dropped)
inline void keep_rows(const float* scratch, int64_t rows, float* y, int64_t y_stride, int64_t g) {
  for (int64_t r = 0; r < rows; ++r) std::copy(scratch + 16 * r, scratch + 16 * r + 16, y + r * y_stride + 16 * g);
}

// Columns 16g .. 16(g + G) - 1 of R rows of bf16 activations xb [R, K] into y (R rows, y_stride apart; `valid` of
// them kept, through a scratch tile when fewer than R). Tiles: 0..G-1 the sums, 4 the activations, 5..7 the weights.
template <int G>
__attribute__((target("amx-tile,amx-bf16"))) void tiles_amx(const Proj& p, int64_t g, const uint16_t* xb,
                                                             int64_t R, int64_t valid, float* y, int64_t y_stride) {
  const int64_t K = p.K, chunks = K / 32;
  const uint16_t* w = p.half + g * K * 16;  // group g's tiles, 512 bf16 a 32-input chunk
  const int64_t group = K * 16;
  _tile_zero(0);
  if constexpr (G > 1) _tile_zero(1);
  if constexpr (G > 2) _tile_zero(2);
  if constexpr (G > 3) _tile_zero(3);
  for (int64_t c = 0; c < chunks; ++c) {
    _tile_loadd(4, xb + 32 * c, K * 2);
    _tile_loadd(5, w + 512 * c, 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (G > 1) {
      _tile_loadd(6, w + group + 512 * c, 64);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (G > 2) {
      _tile_loadd(7, w + 2 * group + 512 * c, 64);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (G > 3) {
      _tile_loadd(5, w + 3 * group + 512 * c, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  float scratch[16 * 16];
  const bool direct = valid == R;
  const int64_t stride = direct ? y_stride * 4 : 64;
  auto out = [&](int j) { return direct ? y + 16 * (g + j) : scratch; };
  auto keep = [&](int j) {  // a partial pass's valid rows, from the scratch tile
    if (!direct) keep_rows(scratch, valid, y, y_stride, g + j);
  };
  _tile_stored(0, out(0), stride);
  keep(0);
  if constexpr (G > 1) {
    _tile_stored(1, out(1), stride);
    keep(1);
  }
  if constexpr (G > 2) {
    _tile_stored(2, out(2), stride);
    keep(2);
  }
  if constexpr (G > 3) {
    _tile_stored(3, out(3), stride);
    keep(3);
  }
}

// Passes of 17..32 rows: two blocks of R rows (xb [2R, K]) against columns 16g .. 16(g + G) - 1, each weight tile
// loaded once for both. Tiles: sums 0, 1 (rows 0..R-1) and 2, 3 (rows R..2R-1), activations 4, 5, weights 6, 7.
// The same products in the same order as tiles_amx's, so a row's bits do not change.
template <int G>
__attribute__((target("amx-tile,amx-bf16"))) void tile_pairs_amx(const Proj& p, int64_t g, const uint16_t* xb,
                                                                  int64_t R, int64_t valid, float* y,
                                                                  int64_t y_stride) {
  const int64_t K = p.K, chunks = K / 32, group = K * 16;
  const uint16_t* w = p.half + g * group;
  _tile_zero(0);
  _tile_zero(2);
  if constexpr (G > 1) {
    _tile_zero(1);
    _tile_zero(3);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    _tile_loadd(4, xb + 32 * c, K * 2);
    _tile_loadd(5, xb + R * K + 32 * c, K * 2);
    _tile_loadd(6, w + 512 * c, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (G > 1) {
      _tile_loadd(7, w + group + 512 * c, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  // the first block's rows are all valid; of the second's, valid - R
  float scratch[16 * 16];
  const int64_t second = valid - R;
  float* y2 = y + R * y_stride;
  const bool direct = second == R;
  auto keep = [&](int j) {
    if (!direct) keep_rows(scratch, second, y2, y_stride, g + j);
  };
  _tile_stored(0, y + 16 * g, y_stride * 4);
  _tile_stored(2, direct ? y2 + 16 * g : scratch, direct ? y_stride * 4 : 64);
  keep(0);
  if constexpr (G > 1) {
    _tile_stored(1, y + 16 * (g + 1), y_stride * 4);
    _tile_stored(3, direct ? y2 + 16 * (g + 1) : scratch, direct ? y_stride * 4 : 64);
    keep(1);
  }
}

// The tile shapes for passes of R rows (a thread's state: each thread of a product loads them, then releases them):
// tiles 0..3 sums of R rows; 4 activations (pairs: 4 and 5); the rest weights, 16 input pairs of 16 columns
__attribute__((target("amx-tile"))) void load_tiles(int64_t R, bool pairs) {
  TileConfig config;
  const int weights = pairs ? 6 : 5;
  for (int t = 0; t < weights; ++t) config.rows[t] = uint8_t(R), config.colsb[t] = 64;
  for (int t = weights; t < 8; ++t) config.rows[t] = 16, config.colsb[t] = 64;
  // GCC's intrinsic tells the compiler it reads 8 bytes, which let it drop the stores of the rest
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

__attribute__((target("amx-tile"))) void release_tiles() { _tile_release(); }

// y [M, N] = x [M, K] W^T for BF16A: the rows in balanced passes of at most 16, output columns 64 at a time over
// torch's threads (each loads the tile shapes itself: they are a thread's state).
void gemm_amx(const Proj& p, const float* x, int64_t M, float* y) {
  const int64_t K = p.K, passes = (M + 15) / 16, R = (M + passes - 1) / passes;
  std::vector<uint16_t> xb(passes * R * K, 0);  // the rows past M stay zero
  to_bf16(x, M * K, xb.data());
  const int64_t groups = p.N / 16;
  if (passes == 2) {  // both row blocks against each weight tile: columns 32 at a time
    at::parallel_for(0, (groups + 1) / 2, 1, [&](int64_t begin, int64_t end) {
      load_tiles(R, true);
      for (int64_t b = begin; b < end; ++b) {
        if (2 * b + 1 < groups) tile_pairs_amx<2>(p, 2 * b, xb.data(), R, M, y, p.N);
        else tile_pairs_amx<1>(p, 2 * b, xb.data(), R, M, y, p.N);
      }
      release_tiles();
    });
  } else {
    at::parallel_for(0, (groups + 3) / 4, 1, [&](int64_t begin, int64_t end) {
      load_tiles(R, false);
      for (int64_t b = begin; b < end; ++b) {
        const int64_t g = 4 * b, G = std::min<int64_t>(4, groups - g);
        for (int64_t pass = 0; pass < passes; ++pass) {
          const int64_t m = pass * R, valid = std::min(R, M - m);
          const uint16_t* rows_b = xb.data() + m * K;
          float* rows_y = y + m * p.N;
          if (G == 4) tiles_amx<4>(p, g, rows_b, R, valid, rows_y, p.N);
          else if (G == 3) tiles_amx<3>(p, g, rows_b, R, valid, rows_y, p.N);
          else if (G == 2) tiles_amx<2>(p, g, rows_b, R, valid, rows_y, p.N);
          else tiles_amx<1>(p, g, rows_b, R, valid, rows_y, p.N);
        }
      }
      release_tiles();
    });
  }
  if (p.bias)
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = 0; n < p.N; ++n) y[r * p.N + n] += p.bias[n];
}

#else
bool amx_granted() { return false; }
bool amx_on = false;
bool lean_amx(bool) { return false; }
void gemm_amx(const Proj&, const float*, int64_t, float*) { TORCH_CHECK(false, "built without AMX intrinsics"); }
#endif

// run(R, m) for the pass size R (a compile-time count, 1..N)
template <int N, class Run>
void with_rows(int64_t R, Run& run, int64_t m) {
  if constexpr (N > 1)
    if (R < N) return with_rows<N - 1>(R, run, m);
  run(std::integral_constant<int, N>(), m);
}

// run(R, m) over M rows in as few passes of at most MAX rows as may be, of balanced sizes (R a compile-time
// count). AVX2 (MAX 6): 12 accumulators, two weights, a broadcast and zero fill its 16 registers; each pass past
// the first adds its products without hiding them under the weights' arrival (docs/speed.md, on a 2-core
// EPYC: a pass of 4 tokens cost 1.1x a one-token step, 6 tokens 1.3x, 7 tokens 1.7x). AVX-512: MAX 16.
template <int MAX, class Run>
void in_passes(int64_t M, Run run) {
  const int64_t passes = (M + MAX - 1) / MAX;
  for (int64_t i = 0, m = 0; i < passes; ++i) {
    const int64_t R = (M - m) / (passes - i);  // the remaining rows shared out, larger passes last
    with_rows<MAX>(R, run, m);
    m += R;
  }
}

template <int R>
void rows(const Proj& p, int64_t n, const float* x, const float* x_sums, float* y, int64_t y_stride) {
  if (p.kind == Q4) return rows_q4<R>(p, n, x, x_sums, y, y_stride);
  if (p.kind == Q8) return rows_q8<R>(p, n, x, y, y_stride);
  if (p.kind == BF16) return rows_bf16<R>(p, n, x, y, y_stride);
  for (int r = 0; r < R; ++r) y[r * y_stride + n] = row_f32(p, n, x + r * p.K);
}

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

// the 8 partial int32 sums of a block's 32 products (u: 0..255, s: -127..127), as floats
inline __m256 block_products(__m256i u, __m256i s) {
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

template <int R>
void rows_q4_q8(const Proj& p, int64_t n, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  const int64_t blocks = p.K / 32;
  const uint8_t* codes = p.codes + n * (p.K / 2);
  const float* dm = p.scales + n * blocks * 2;
  const __m128i low4 = _mm_set1_epi8(0x0F);
  __m256 acc[R];
  float offsets[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), offsets[r] = 0.f;
  for (int64_t b = 0; b < blocks; ++b) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * b));
    const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(raw, low4));
    for (int r = 0; r < R; ++r) {
      const int64_t row = (m + r) * blocks + b;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes.data() + row * 32));
      acc[r] = _mm256_fmadd_ps(block_products(w, q), _mm256_set1_ps(dm[2 * b] * x.d[row]), acc[r]);
      offsets[r] += dm[2 * b + 1] * x.d_sum[row];
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride + n] = hsum(acc[r]) + offsets[r];
}

template <int R>
void rows_q8_q8(const Proj& p, int64_t n, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  const int64_t blocks = p.K / 32;
  const int8_t* codes = reinterpret_cast<const int8_t*>(p.codes) + n * p.K;
  const float* d = p.scales + n * blocks;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * b));
    const __m256i magnitude = _mm256_sign_epi8(w, w);  // |w| as unsigned, its sign moved onto the activations
    for (int r = 0; r < R; ++r) {
      const int64_t row = (m + r) * blocks + b;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes.data() + row * 32));
      acc[r] = _mm256_fmadd_ps(block_products(magnitude, _mm256_sign_epi8(q, w)), _mm256_set1_ps(d[b] * x.d[row]),
                               acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride + n] = hsum(acc[r]);
}

template <int R>
void rows_q8act(const Proj& p, int64_t n, const RowsQ8& x, int64_t m, float* y, int64_t y_stride) {
  if (p.kind == Q4) return rows_q4_q8<R>(p, n, x, m, y, y_stride);
  return rows_q8_q8<R>(p, n, x, m, y, y_stride);
}

// Column-interleaved blocks (Q4X, Q8X; 8-bit activations only). A 256-bit register holds 4 consecutive codes of
// each of 8 output columns, and the activation's matching 4 codes are broadcast to all 8 lanes: one maddubs then
// advances 8 columns' sums at once, and a block's scaling (cvt, scale, fma) is paid once per 8 columns instead of
// once per column with a horizontal sum at the end, as the row layout above does. Codes for a group of 8 columns
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

// The same two layouts with AVX-512 VNNI (where the CPU has it): vpdpbusd multiplies 4 unsigned codes by 4 signed
// ones and adds the 4 products to a 32-bit lane in one instruction, where AVX2 needs maddubs, an add and (per block)
// a madd. The integer sums are exact either way, so both paths give a block the same total and a row the same bits
// (lean_vnni switches, for that test); with 32 registers a pass takes up to 8 rows.
bool vnni_on = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");

bool lean_vnni(bool on) {
  vnni_on = on && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
  return vnni_on;
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

// GGUF blocks as the file ships them (kind GGUF), each row in its part's type. The codes stay in the file's bytes,
// and a block's scales are decoded as its inputs are read, so a weight streams in the file's bits per weight.
// Types, by ggml's numbers (w: an input's weight; d, m fp16):
//   Q4_0 (2), Q5_0 (6): 32 inputs, d and 4- or 5-bit codes q: w = d (q - 8), w = d (q - 16)
//   Q4_1 (3), Q5_1 (7): 32 inputs, d, m and 4- or 5-bit codes q: w = d q + m
//   Q8_0 (8): 32 inputs, d and int8 codes q: w = d q
//   Q4_K (12), Q5_K (13): 256 inputs, d, dmin, then a 6-bit scale s and min m for each 32: w = (d s) q - (dmin m)
//   Q6_K (14): 256 inputs, 6-bit codes q, an int8 scale s for each 16, d: w = (d s) (q - 32)
// Every block reads as chunks of 32 inputs (Chunk): 32 codes and their scales. Float activations turn a chunk into
// its 32 weights in registers (chunk_weights: the reference dequantization's products, with one rounding where it
// has two); 8-bit activations multiply its codes as integers with the activations' own codes, as llama.cpp's dot
// products do (the activations in blocks of 32, and for K-quants in blocks of 256 as llama.cpp's Q8_K: RowsQ8K).
// A chunk is decoded once for all rows of a pass, and each row's sums run in one fixed order.
enum GgmlType : int64_t { GQ4_0 = 2, GQ4_1 = 3, GQ5_0 = 6, GQ5_1 = 7, GQ8_0 = 8, GQ4_K = 12, GQ5_K = 13, GQ6_K = 14 };

// an fp16 number (little-endian, as GGUF stores them) as a float, exactly
inline float half_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);  // F16C: every CPU with AVX2 that PyTorch runs its AVX2 kernels on has it
}

struct Chunk {
  __m256i q;     // 32 codes in input order: unsigned (0..63) or, for signed types, with their offset taken off
  float lo, hi;  // the scale of inputs 0..15 and of inputs 16..31 (the same but in Q6_K)
  float min;     // added to every weight (unsigned types)
};

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of nibbles: inputs 0..15 in the low nibbles, 16..31 in the high ones (the 32-input blocks' order)
inline __m256i nibbles16(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), low4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(raw, low4));
}

// 32 bytes of nibbles, the low (high = false) or the high ones: 32 inputs
inline __m256i nibbles32(const uint8_t* qs, bool high) {
  const __m256i raw = load32(qs);
  return _mm256_and_si256(high ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0F));
}

// byte i = 16 where bit i of `bits` is set, else 0 (Q5_0 / Q5_1's fifth bits)
inline __m256i fifth_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i which = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i byte_of = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), which);  // byte i: byte i / 8 of bits
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));               // byte i: bit i % 8
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(byte_of, bit), bit), _mm256_set1_epi8(16));
}

// bits `shift` .. shift + width - 1 of each of 32 bytes, as 0 .. 2^width - 1
inline __m256i bit_field(const uint8_t* p, int shift, int mask) {
  return _mm256_and_si256(_mm256_srl_epi16(load32(p), _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(char(mask)));
}

// Q4_K / Q5_K: the 6-bit scale and min of 32-input chunk j from the block's 12 bytes
inline void scale_min_k(int j, const uint8_t* s, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {  // low 4 bits in byte j + 4, high 2 in the top bits of byte j - 4 (scale) and j (min)
    scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Per type: inputs a block (values), a block's bytes, whether its codes are signed, and chunk(block, j)
template <int64_t T>
struct Gguf;

template <>
struct Gguf<GQ4_0> {
  static constexpr int64_t values = 32, bytes = 18;
  static constexpr bool is_signed = true;
  static Chunk chunk(const uint8_t* b, int) {
    const float d = half_float(b);
    return {_mm256_sub_epi8(nibbles16(b + 2), _mm256_set1_epi8(8)), d, d, 0.f};
  }
};

template <>
struct Gguf<GQ4_1> {
  static constexpr int64_t values = 32, bytes = 20;
  static constexpr bool is_signed = false;
  static Chunk chunk(const uint8_t* b, int) {
    const float d = half_float(b);
    return {nibbles16(b + 4), d, d, half_float(b + 2)};
  }
};

template <>
struct Gguf<GQ5_0> {
  static constexpr int64_t values = 32, bytes = 22;
  static constexpr bool is_signed = true;
  static Chunk chunk(const uint8_t* b, int) {  // d, 4 bytes of fifth bits (input i: bit i), 16 of nibbles
    const float d = half_float(b);
    const __m256i q = _mm256_or_si256(nibbles16(b + 6), fifth_bits(b + 2));
    return {_mm256_sub_epi8(q, _mm256_set1_epi8(16)), d, d, 0.f};
  }
};

template <>
struct Gguf<GQ5_1> {
  static constexpr int64_t values = 32, bytes = 24;
  static constexpr bool is_signed = false;
  static Chunk chunk(const uint8_t* b, int) {  // d, m, fifth bits, nibbles
    const float d = half_float(b);
    return {_mm256_or_si256(nibbles16(b + 8), fifth_bits(b + 4)), d, d, half_float(b + 2)};
  }
};

template <>
struct Gguf<GQ8_0> {
  static constexpr int64_t values = 32, bytes = 34;
  static constexpr bool is_signed = true;
  static Chunk chunk(const uint8_t* b, int) {
    const float d = half_float(b);
    return {load32(b + 2), d, d, 0.f};
  }
};

// Q4_K: d, dmin, 12 bytes of scales and mins, 128 of codes: chunks 2i and 2i + 1 are the low and high nibbles of
// bytes 32i .. 32i + 31
template <>
struct Gguf<GQ4_K> {
  static constexpr int64_t values = 256, bytes = 144;
  static constexpr bool is_signed = false;
  static __m256i codes(const uint8_t* b, int j) { return nibbles32(b + 16 + 32 * (j / 2), j & 1); }
  static Chunk chunk(const uint8_t* b, int j) {
    int scale, min;
    scale_min_k(j, b + 4, scale, min);
    const float d = half_float(b) * float(scale);
    return {codes(b, j), d, d, -(half_float(b + 2) * float(min))};
  }
};

// Q5_K: as Q4_K, with 32 bytes of fifth bits before the codes: input l of chunk j has bit j of byte l
template <>
struct Gguf<GQ5_K> {
  static constexpr int64_t values = 256, bytes = 176;
  static constexpr bool is_signed = false;
  static __m256i codes(const uint8_t* b, int j) {
    const __m256i fifth = _mm256_slli_epi16(bit_field(b + 16, j, 1), 4);
    return _mm256_or_si256(nibbles32(b + 48 + 32 * (j / 2), j & 1), fifth);
  }
  static Chunk chunk(const uint8_t* b, int j) {
    int scale, min;
    scale_min_k(j, b + 4, scale, min);
    const float d = half_float(b) * float(scale);
    return {codes(b, j), d, d, -(half_float(b + 2) * float(min))};
  }
};

// Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d. Each half of the block (128 inputs):
// 64 bytes of nibbles (inputs l and 64 + l in byte l's low and high nibble, l < 64) and 32 of bit pairs (byte l:
// the high bits of inputs l, 32 + l, 64 + l, 96 + l); the scales in input order, one for each 16.
template <>
struct Gguf<GQ6_K> {
  static constexpr int64_t values = 256, bytes = 210;
  static constexpr bool is_signed = true;
  static __m256i codes(const uint8_t* b, int j) {  // with the offset of 32 taken off
    const int half = j / 4, k = j % 4;
    const __m256i low = nibbles32(b + 64 * half + 32 * (k & 1), k >= 2);
    const __m256i high = _mm256_slli_epi16(bit_field(b + 128 + 32 * half, 2 * k, 3), 4);
    return _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
  }
  static Chunk chunk(const uint8_t* b, int j) {
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_float(b + 208);
    return {codes(b, j), d * float(scales[2 * j]), d * float(scales[2 * j + 1]), 0.f};
  }
};

// run(T) with the type as a compile-time constant
template <class Run>
void with_gguf_type(int64_t type, Run run) {
  switch (type) {
    case GQ4_0: return run(std::integral_constant<int64_t, GQ4_0>());
    case GQ4_1: return run(std::integral_constant<int64_t, GQ4_1>());
    case GQ5_0: return run(std::integral_constant<int64_t, GQ5_0>());
    case GQ5_1: return run(std::integral_constant<int64_t, GQ5_1>());
    case GQ8_0: return run(std::integral_constant<int64_t, GQ8_0>());
    case GQ4_K: return run(std::integral_constant<int64_t, GQ4_K>());
    case GQ5_K: return run(std::integral_constant<int64_t, GQ5_K>());
    case GQ6_K: return run(std::integral_constant<int64_t, GQ6_K>());
    default: TORCH_CHECK(false, "GGUF block type ", type, " has no kernel (ggml types 2, 3, 6, 7, 8, 12, 13, 14 do)");
  }
}

// A row's bytes for K inputs of `type`
int64_t gguf_row_bytes(int64_t type, int64_t K) {
  int64_t out = 0;
  with_gguf_type(type, [&](auto T) {
    using G = Gguf<decltype(T)::value>;
    TORCH_CHECK(K % G::values == 0, "GGUF type ", type, " holds rows of whole blocks of ", G::values, " inputs, not ", K);
    out = K / G::values * G::bytes;
  });
  return out;
}

// A chunk's 32 weights, 8 a vector
template <bool SIGNED>
inline void chunk_weights(const Chunk& c, __m256 w[4]) {
  const __m128i low = _mm256_castsi256_si128(c.q), high = _mm256_extracti128_si256(c.q, 1);
  const __m128i eights[4] = {low, _mm_srli_si128(low, 8), high, _mm_srli_si128(high, 8)};
  for (int i = 0; i < 4; ++i) {
    const __m256 scale = _mm256_set1_ps(i < 2 ? c.lo : c.hi);
    if constexpr (SIGNED) w[i] = _mm256_mul_ps(bytes_i8(eights[i]), scale);
    else w[i] = _mm256_fmadd_ps(bytes_u8(eights[i]), scale, _mm256_set1_ps(c.min));
  }
}

// chunk(b, j, k) for each chunk of a row of K inputs: b its block, j its index there, k its first input
template <int64_t T, class Each>
inline void over_chunks(const uint8_t* row, int64_t K, Each each) {
  using G = Gguf<T>;
  for (int64_t block = 0; block < K / G::values; ++block)
    for (int j = 0; j < int(G::values / 32); ++j) each(row + block * G::bytes, j, block * G::values + 32 * j);
}

// Output column n of R rows of float activations x [R, K] against one row of blocks: the chunk's weights made once
// for all R rows, each row's sum in two chains (even and odd vectors of 8 inputs), the same for every R
template <int64_t T, int R>
void rows_gguf(const uint8_t* row, int64_t K, const float* x, float* y, int64_t y_stride, int64_t n) {
  __m256 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = _mm256_setzero_ps(), odd[r] = _mm256_setzero_ps();
  over_chunks<T>(row, K, [&](const uint8_t* b, int j, int64_t k) {
    __m256 w[4];
    chunk_weights<Gguf<T>::is_signed>(Gguf<T>::chunk(b, j), w);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * K + k;
      even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr), w[0], even[r]);
      odd[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), w[1], odd[r]);
      even[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 16), w[2], even[r]);
      odd[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 24), w[3], odd[r]);
    }
  });
  for (int r = 0; r < R; ++r) y[r * y_stride + n] = hsum(_mm256_add_ps(even[r], odd[r]));
}

// The 32-input types with 8-bit activations (rows m .. m + R - 1 of x): per block the integer products of its codes
// with the activations' codes, 8 sums of 4 inputs, times the block's d and the activations' d. Q4_0 and Q5_0 take
// their codes unsigned (0..15, 0..31) with their offset (-8 d, -16 d) as Q4_1 and Q5_1 take their m: times the
// activations' d * code sum, once a block. Q8_0's signed codes: their magnitude as unsigned, their sign moved onto
// the activations (maddubs multiplies unsigned by signed bytes); 2 products of |code| <= 128 by |activation| <=
// 127 fit its 16-bit sums.
template <int64_t T>
inline Chunk codes_q8(const uint8_t* b) {  // the block's codes as the 8-bit activations' products take them
  const float d = half_float(b);
  if constexpr (T == GQ4_0) return {nibbles16(b + 2), d, d, -8.f * d};
  if constexpr (T == GQ5_0) return {_mm256_or_si256(nibbles16(b + 6), fifth_bits(b + 2)), d, d, -16.f * d};
  if constexpr (T == GQ8_0) return {load32(b + 2), d, d, 0.f};
  return Gguf<T>::chunk(b, 0);  // Q4_1, Q5_1: unsigned codes and m already
}

template <int64_t T, int R>
void rows_gguf_q8(const uint8_t* row, int64_t K, const RowsQ8& x, int64_t m, float* y, int64_t y_stride, int64_t n) {
  static_assert(Gguf<T>::values == 32, "K-quants take rows_kquant_q8");
  constexpr bool SIGNED = T == GQ8_0;
  const int64_t blocks = K / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  float offsets[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), offsets[r] = 0.f;
  for (int64_t block = 0; block < blocks; ++block) {
    const Chunk c = codes_q8<T>(row + block * Gguf<T>::bytes);
    const __m256i magnitude = SIGNED ? _mm256_sign_epi8(c.q, c.q) : c.q;
    for (int r = 0; r < R; ++r) {
      const int64_t a = (m + r) * blocks + block;
      __m256i q = load32(reinterpret_cast<const uint8_t*>(x.codes.data()) + a * 32);
      if constexpr (SIGNED) q = _mm256_sign_epi8(q, c.q);
      const __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, q), ones));
      acc[r] = _mm256_fmadd_ps(sums, _mm256_set1_ps(c.lo * x.d[a]), acc[r]);
      if constexpr (!SIGNED) offsets[r] = std::fma(c.min, x.d_sum[a], offsets[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride + n] = hsum(acc[r]) + offsets[r];
}

// K-quants (Q4_K, Q5_K, Q6_K) with Q8_K activations (RowsQ8K), a block of 256 inputs at a time, as llama.cpp's dot
// products do. The block's d (and dmin) and its chunks' integer scales are decoded once for all rows; each chunk's
// integer products are multiplied by its integer scale in the madd that sums them (both 16-input halves' scales at
// once, as Q6_K needs) and added up as integers over the block; one float step a block then scales them by d times
// the activations' d, and the mins' term (the block's 8 mins against the activations' 8 code sums, as integers) by
// dmin. Every row's sums run in this one order whatever the pass's width.
struct KScales {
  float d, dmin;                  // dmin: 0 for Q6_K
  int16_t lo[8], hi[8];           // chunk j: the scales of inputs 0..15 and 16..31 (equal but in Q6_K)
  __m128i min;                    // the 8 chunks' mins as int16 (Q4_K, Q5_K)
};

template <int64_t T>
inline KScales k_scales(const uint8_t* b) {
  KScales k;
  if constexpr (T == GQ6_K) {
    const int8_t* s = reinterpret_cast<const int8_t*>(b + 192);
    k.d = half_float(b + 208), k.dmin = 0.f, k.min = _mm_setzero_si128();
    for (int j = 0; j < 8; ++j) k.lo[j] = s[2 * j], k.hi[j] = s[2 * j + 1];
  } else {
    // scale_min_k's unpacking on 32-bit words, 4 chunks a word: the mins go to a vector without a round trip
    // through memory (8 int16 stores read back as one vector stall the load, once a block)
    k.d = half_float(b), k.dmin = half_float(b + 2);
    uint32_t w[3];
    std::memcpy(w, b + 4, 12);
    const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    const uint32_t scales[2] = {w[0] & six, (w[2] & four) | (((w[0] >> 6) & two) << 4)};
    const uint32_t mins[2] = {w[1] & six, ((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4)};
    for (int j = 0; j < 8; ++j) k.lo[j] = k.hi[j] = int16_t((scales[j / 4] >> (8 * (j % 4))) & 0xff);
    k.min = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(mins[1]), int(mins[0])));
  }
  return k;
}

inline float hsum128(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

template <int64_t T, int R>
void rows_kquant_q8(const uint8_t* row, int64_t K, const RowsQ8K& x, int64_t m, float* y, int64_t y_stride, int64_t n) {
  using G = Gguf<T>;
  constexpr bool SIGNED = G::is_signed;
  const int64_t blocks = K / 256;
  __m256 acc[R];
  __m128 mins[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), mins[r] = _mm_setzero_ps();
  for (int64_t block = 0; block < blocks; ++block) {
    const uint8_t* b = row + block * G::bytes;
    const KScales k = k_scales<T>(b);
    __m256i part[R];
    for (int r = 0; r < R; ++r) part[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i q = G::codes(b, j);
      const __m256i magnitude = SIGNED ? _mm256_sign_epi8(q, q) : q;
      const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(k.hi[j]), _mm_set1_epi16(k.lo[j]));
      for (int r = 0; r < R; ++r) {
        __m256i qa = load32(reinterpret_cast<const uint8_t*>(x.codes.data() + (m + r) * K + 256 * block + 32 * j));
        if constexpr (SIGNED) qa = _mm256_sign_epi8(qa, q);
        part[r] = _mm256_add_epi32(part[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, qa), scale));
      }
    }
    for (int r = 0; r < R; ++r) {
      const float d = x.d[(m + r) * blocks + block];
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(part[r]), _mm256_set1_ps(k.d * d), acc[r]);
      if constexpr (!SIGNED) {
        const __m128i sums = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sums.data() + (m + r) * (K / 32) + 8 * block));
        mins[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(sums, k.min)), _mm_set1_ps(-k.dmin * d), mins[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride + n] = hsum(acc[r]) + hsum128(mins[r]);
}

// Q4_K blocks with 8 output columns interleaved (KQ4X), for 8-bit activations: per group of 8 columns and block of
// 256 inputs one record of KQ4X_BYTES, in the order the kernel reads it (a record streams front to back; with the
// codes and the scales apart, a large matrix streamed from memory at about half the speed, as KQ6X's output layer
// showed): for each chunk j of 32 inputs, KQ4X_CHUNK bytes
//   codes  [4][32]: as Q4X's, vector v, lane c, byte i holds column c's code of input 32j + 4v + i in its low nibble
//          and of input 32j + 16 + 4v + i in its high nibble
//   scales [8 columns] uint8, the chunk's 6-bit scales
// then mins [4 pairs of chunks][8 columns][2] uint8, the chunks' 6-bit mins side by side (2k, 2k + 1), widened to
// 16 bits in registers (stored as int16 they made the records 8% larger than the file's blocks, and a one-token
// step streams them from memory)
//   d, dmin [8 columns] fp16 each
// One instruction then advances 8 columns' sums of 4 inputs (no horizontal sums), a chunk's scale is one multiply
// for the 8 columns, and the mins' term is 4 madds a block; the activations are RowsQ8K (Q8_K) as the row kernel's.
// A block's integer sums are exact and its float steps come in one order, so a row's result does not depend on
// the rows beside it; AVX-512 VNNI (vpdpbusd) and AVX2 (maddubs, then madd) compute the same integers.
constexpr int64_t KQ4X_CHUNK = 136, KQ4X_SCALES = 128, KQ4X_MINS = 1088, KQ4X_D = 1152, KQ4X_BYTES = 1184;

// Records of 8 output columns per block of 256 inputs from N rows of K-quant blocks of `block_bytes` (N a multiple
// of 8): uint8 [N / 8, K / 256, record_bytes], fill(record, c, block) writing column c's block into its record
template <class Fill>
torch::Tensor interleaved_records(const torch::Tensor& bytes, int64_t N, int64_t K, int64_t block_bytes,
                                  int64_t record_bytes, const char* what, Fill fill) {
  TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.is_contiguous() && N % 8 == 0 && K % 256 == 0 &&
                  bytes.numel() == N * (K / 256) * block_bytes,
              what, " rows: contiguous uint8 [N * K / 256 * ", block_bytes, "], N % 8 == 0");
  const int64_t blocks = K / 256;
  auto out = torch::zeros({N / 8, blocks, record_bytes}, torch::kByte);
  const uint8_t* in = bytes.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, N / 8, 16, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      for (int64_t b = 0; b < blocks; ++b)
        for (int c = 0; c < 8; ++c) fill(o + (g * blocks + b) * record_bytes, c, in + ((8 * g + c) * blocks + b) * block_bytes);
  });
  return out;
}

// The KQ4X records of N rows of Q4_K blocks (N a multiple of 8): uint8 [N / 8, K / 256, KQ4X_BYTES]
torch::Tensor interleave_q4k(torch::Tensor bytes, int64_t N, int64_t K) {
  return interleaved_records(bytes, N, K, 144, KQ4X_BYTES, "Q4_K", [](uint8_t* rec, int c, const uint8_t* blk) {
    for (int j = 0; j < 8; ++j) {
      auto code = [&](int i) { const uint8_t v = blk[16 + 32 * (j / 2) + i]; return (j & 1) ? v >> 4 : v & 0x0F; };
      for (int v = 0; v < 4; ++v)
        for (int i = 0; i < 4; ++i)
          rec[KQ4X_CHUNK * j + 32 * v + 4 * c + i] = uint8_t(code(4 * v + i) | (code(16 + 4 * v + i) << 4));
      int scale, min;
      scale_min_k(j, blk + 4, scale, min);
      rec[KQ4X_CHUNK * j + KQ4X_SCALES + c] = uint8_t(scale);
      rec[KQ4X_MINS + 16 * (j / 2) + 2 * c + (j & 1)] = uint8_t(min);
    }
    std::memcpy(rec + KQ4X_D + 2 * c, blk, 2);       // d
    std::memcpy(rec + KQ4X_D + 16 + 2 * c, blk + 2, 2);  // dmin
  });
}

// chunk j's 8 columns' sums for R rows: sums[r] = the int32 products of the chunk's codes with row r's codes (a:
// each row's codes of this block). Inlined where the caller has its instruction set (group_kq4x_vnni).
template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) inline void kq4x_chunk_vnni(
    const uint8_t* rec, int j, const int8_t* const* a, __m256i* sums) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i high[R];  // a second chain per row: vpdpbusd's latency, not its throughput, bounds one chain
  for (int r = 0; r < R; ++r) sums[r] = high[r] = _mm256_setzero_si256();
  for (int v = 0; v < 4; ++v) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + KQ4X_CHUNK * j + 32 * v));
    const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    for (int r = 0; r < R; ++r) {
      sums[r] = _mm256_dpbusd_epi32(sums[r], lo, spread4(a[r] + 32 * j + 4 * v));
      high[r] = _mm256_dpbusd_epi32(high[r], hi, spread4(a[r] + 32 * j + 16 + 4 * v));
    }
  }
  for (int r = 0; r < R; ++r) sums[r] = _mm256_add_epi32(sums[r], high[r]);
}

template <int R>
__attribute__((always_inline)) inline void kq4x_chunk_avx2(const uint8_t* rec, int j, const int8_t* const* a,
                                                           __m256i* sums) {
  // 16 products of codes <= 15 by |activations| <= 127 per 16-bit lane: 16 * 15 * 127 < 2^15, no overflow
  nibble_sums_avx2<R>(rec + KQ4X_CHUNK * j, a, 32 * j, sums);
}

// Columns 8g .. 8g + 7 of R rows (m .. m + R - 1 of x) against KQ4X records (forced inline into the two entry points
// below, each compiled for its instruction set)
template <int R, bool VNNI>
__attribute__((always_inline)) inline void group_kq4x(const uint8_t* records, int64_t K, int64_t g, int64_t groups,
                                                      const RowsQ8K& x, int64_t m, float* y, int64_t y_stride) {
  const int64_t blocks = K / 256;
  const int8_t* a[R];
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const bool fetch = fetches(m, g, groups);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* rec = records + (g * blocks + b) * KQ4X_BYTES;
    if (fetch) fetch_ahead(rec + prefetch_groups * blocks * KQ4X_BYTES, KQ4X_BYTES);
    for (int r = 0; r < R; ++r) a[r] = x.codes.data() + (m + r) * K + 256 * b;
    __m256i total[R];
    for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      __m256i sums[R];
      for (int r = 0; r < R; ++r) sums[r] = _mm256_setzero_si256();
      if constexpr (VNNI) kq4x_chunk_vnni<R>(rec, j, a, sums);
      else kq4x_chunk_avx2<R>(rec, j, a, sums);
      const __m256i scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + KQ4X_CHUNK * j + KQ4X_SCALES)));
      for (int r = 0; r < R; ++r) total[r] = _mm256_add_epi32(total[r], _mm256_mullo_epi32(sums[r], scale));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ4X_D)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ4X_D + 16)));
    for (int r = 0; r < R; ++r) {
      const int16_t* bsums = x.sums.data() + (m + r) * (K / 32) + 8 * b;
      __m256i mins = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        int32_t pair;
        std::memcpy(&pair, bsums + 2 * k, 4);
        mins = _mm256_add_epi32(mins, _mm256_madd_epi16(
            _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ4X_MINS + 16 * k))),
            _mm256_set1_epi32(pair)));
      }
      const __m256 xd = _mm256_set1_ps(x.d[(m + r) * blocks + b]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[r]), _mm256_mul_ps(d, xd), acc[r]);
      acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, xd), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * y_stride + 8 * g, acc[r]);
}

template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) void group_kq4x_vnni(
    const uint8_t* records, int64_t K, int64_t g, int64_t groups, const RowsQ8K& x, int64_t m, float* y,
    int64_t y_stride) {
  group_kq4x<R, true>(records, K, g, groups, x, m, y, y_stride);
}

template <int R>
void group_kq4x_avx2(const uint8_t* records, int64_t K, int64_t g, int64_t groups, const RowsQ8K& x, int64_t m,
                     float* y, int64_t y_stride) {
  group_kq4x<R, false>(records, K, g, groups, x, m, y, y_stride);
}

// Q6_K blocks with 8 output columns interleaved (KQ6X), for 8-bit activations: per group of 8 columns and block of
// 256 inputs one record of KQ6X_BYTES, exactly the 8 blocks' bytes: for each chunk j of 32 inputs, KQ6X_CHUNK bytes
// in the order the kernel reads them (a record streams front to back: with the parts apart, a 191 MB output layer
// read at half the speed)
//   low    [4][32]: the codes' low 4 bits, as KQ4X's codes (inputs 32j + 4v + i low, + 16 high nibble)
//   high   [2][32]: their top 2 bits; lane c, byte i of the first vector holds inputs 32j + 4v + i of column c in
//          bits 2v, 2v + 1 (v = 0..3), of the second inputs 32j + 16 + 4v + i
//   scales [2 groups][8 columns] int8, one per 16 inputs
// then d [8 columns] fp16.
// The codes go in unsigned (u = q + 32, 0..63; vpdpbusd multiplies unsigned by signed bytes) and each 16's offset
// comes back through the activations' code sums: sum s (u - 32) a = sum s u a - 32 sum s (sum of the 16 a).
constexpr int64_t KQ6X_CHUNK = 208, KQ6X_HIGH = 128, KQ6X_SCALES = 192, KQ6X_D = 1664, KQ6X_BYTES = 1680;

// The KQ6X records of N rows of Q6_K blocks (N a multiple of 8): uint8 [N / 8, K / 256, KQ6X_BYTES]
torch::Tensor interleave_q6k(torch::Tensor bytes, int64_t N, int64_t K) {
  return interleaved_records(bytes, N, K, 210, KQ6X_BYTES, "Q6_K", [](uint8_t* rec, int c, const uint8_t* blk) {
    for (int j = 0; j < 8; ++j) {
      const int half = j / 4, k = j % 4;
      auto code = [&](int l) {  // input l of chunk j, 0..63 (Gguf<GQ6_K>::codes' layout, offset kept)
        const uint8_t low = blk[64 * half + 32 * (k & 1) + l];
        return ((k >= 2 ? low >> 4 : low & 0x0F) | (((blk[128 + 32 * half + l] >> (2 * k)) & 3) << 4));
      };
      for (int v = 0; v < 4; ++v)
        for (int i = 0; i < 4; ++i) {
          const int lo = code(4 * v + i), hi = code(16 + 4 * v + i);
          uint8_t* chunk = rec + KQ6X_CHUNK * j;
          chunk[32 * v + 4 * c + i] = uint8_t((lo & 0x0F) | ((hi & 0x0F) << 4));
          chunk[KQ6X_HIGH + 4 * c + i] |= uint8_t((lo >> 4) << (2 * v));
          chunk[KQ6X_HIGH + 32 + 4 * c + i] |= uint8_t((hi >> 4) << (2 * v));
        }
      rec[KQ6X_CHUNK * j + KQ6X_SCALES + c] = blk[192 + 2 * j];
      rec[KQ6X_CHUNK * j + KQ6X_SCALES + 8 + c] = blk[192 + 2 * j + 1];
    }
    std::memcpy(rec + KQ6X_D + 2 * c, blk + 208, 2);
  });
}

// chunk j's codes for vector v: the unsigned 6-bit codes of inputs 4v + i (lo) and 16 + 4v + i (hi), 8 columns.
// A byte's 2 top bits for vector v sit at bits 2v, 2v + 1 of `top`: shifted to bits 4, 5 (a 16-bit shift moves
// the neighbour byte's bits too, into bits the mask drops).
template <int V>
inline void kq6x_codes(__m256i raw, __m256i top_lo, __m256i top_hi, __m256i& lo, __m256i& hi) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  auto at45 = [&](__m256i top) {
    if constexpr (V < 2) return _mm256_and_si256(_mm256_slli_epi16(top, 4 - 2 * V), bits45);
    else if constexpr (V == 2) return _mm256_and_si256(top, bits45);
    else return _mm256_and_si256(_mm256_srli_epi16(top, 2), bits45);
  };
  lo = _mm256_or_si256(_mm256_and_si256(raw, low4), at45(top_lo));
  hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4), at45(top_hi));
}

// fn(lo, hi, v) for chunk j's 4 vectors of codes
template <class Fn>
__attribute__((always_inline)) inline void kq6x_vectors(const uint8_t* rec, int j, Fn fn) {
  const uint8_t* chunk = rec + KQ6X_CHUNK * j;
  const __m256i top_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + KQ6X_HIGH));
  const __m256i top_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + KQ6X_HIGH + 32));
  const __m256i* raw = reinterpret_cast<const __m256i*>(chunk);
  __m256i lo, hi;
  kq6x_codes<0>(_mm256_loadu_si256(raw), top_lo, top_hi, lo, hi), fn(lo, hi, 0);
  kq6x_codes<1>(_mm256_loadu_si256(raw + 1), top_lo, top_hi, lo, hi), fn(lo, hi, 1);
  kq6x_codes<2>(_mm256_loadu_si256(raw + 2), top_lo, top_hi, lo, hi), fn(lo, hi, 2);
  kq6x_codes<3>(_mm256_loadu_si256(raw + 3), top_lo, top_hi, lo, hi), fn(lo, hi, 3);
}

// chunk j's two 16-input groups' sums for R rows (a: each row's codes of this block), unsigned codes
template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) inline void kq6x_chunk_vnni(
    const uint8_t* rec, int j, const int8_t* const* a, __m256i* first, __m256i* second) {
  for (int r = 0; r < R; ++r) first[r] = second[r] = _mm256_setzero_si256();
  kq6x_vectors(rec, j, [&](__m256i lo, __m256i hi, int v) {
    for (int r = 0; r < R; ++r) {
      first[r] = _mm256_dpbusd_epi32(first[r], lo, spread4(a[r] + 32 * j + 4 * v));
      second[r] = _mm256_dpbusd_epi32(second[r], hi, spread4(a[r] + 32 * j + 16 + 4 * v));
    }
  });
}

template <int R>
__attribute__((always_inline)) inline void kq6x_chunk_avx2(const uint8_t* rec, int j, const int8_t* const* a,
                                                           __m256i* first, __m256i* second) {
  // a maddubs of codes <= 63 by |activations| <= 127: 2 * 63 * 127 < 2^15; widened to 32 bits at once
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) first[r] = second[r] = _mm256_setzero_si256();
  kq6x_vectors(rec, j, [&](__m256i lo, __m256i hi, int v) {
    for (int r = 0; r < R; ++r) {
      first[r] = _mm256_add_epi32(first[r], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, spread4(a[r] + 32 * j + 4 * v)), ones));
      second[r] = _mm256_add_epi32(second[r],
                                   _mm256_madd_epi16(_mm256_maddubs_epi16(hi, spread4(a[r] + 32 * j + 16 + 4 * v)), ones));
    }
  });
}

// Columns 8g .. 8g + 7 of R rows against KQ6X records; sums16: the rows' activation code sums per 16 inputs
template <int R, bool VNNI>
__attribute__((always_inline)) inline void group_kq6x(const uint8_t* records, int64_t K, int64_t g, int64_t groups,
                                                      const RowsQ8K& x, const int16_t* sums16, int64_t m, float* y,
                                                      int64_t y_stride) {
  const int64_t blocks = K / 256;
  const int8_t* a[R];
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const bool fetch = fetches(m, g, groups);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* rec = records + (g * blocks + b) * KQ6X_BYTES;
    if (fetch) fetch_ahead(rec + prefetch_groups * blocks * KQ6X_BYTES, KQ6X_BYTES);
    for (int r = 0; r < R; ++r) a[r] = x.codes.data() + (m + r) * K + 256 * b;
    __m256i total[R];
    for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      __m256i first[R], second[R];
      if constexpr (VNNI) kq6x_chunk_vnni<R>(rec, j, a, first, second);
      else kq6x_chunk_avx2<R>(rec, j, a, first, second);
      const uint8_t* scales = rec + KQ6X_CHUNK * j + KQ6X_SCALES;
      const __m256i s1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)));
      const __m256i s2 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + 8)));
      for (int r = 0; r < R; ++r)
        total[r] = _mm256_add_epi32(total[r], _mm256_add_epi32(_mm256_mullo_epi32(first[r], s1),
                                                               _mm256_mullo_epi32(second[r], s2)));
    }
    // the offsets: 32 * sum over the 16 groups of scale * the group's activation code sum, 2 groups a madd
    __m256i pairs[8];
    for (int k = 0; k < 8; ++k) {
      const __m128i both = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ6X_CHUNK * k + KQ6X_SCALES));
      pairs[k] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(both, _mm_srli_si128(both, 8)));  // (s_2k, s_2k+1) a column
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + KQ6X_D)));
    for (int r = 0; r < R; ++r) {
      const int16_t* s = sums16 + (m + r) * (K / 16) + 16 * b;
      __m256i offset = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        int32_t pair;
        std::memcpy(&pair, s + 2 * k, 4);
        offset = _mm256_add_epi32(offset, _mm256_madd_epi16(pairs[k], _mm256_set1_epi32(pair)));
      }
      total[r] = _mm256_sub_epi32(total[r], _mm256_slli_epi32(offset, 5));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[r]), _mm256_mul_ps(d, _mm256_set1_ps(x.d[(m + r) * blocks + b])),
                               acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * y_stride + 8 * g, acc[r]);
}

template <int R>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni"))) void group_kq6x_vnni(
    const uint8_t* records, int64_t K, int64_t g, int64_t groups, const RowsQ8K& x, const int16_t* sums16, int64_t m,
    float* y, int64_t y_stride) {
  group_kq6x<R, true>(records, K, g, groups, x, sums16, m, y, y_stride);
}

template <int R>
void group_kq6x_avx2(const uint8_t* records, int64_t K, int64_t g, int64_t groups, const RowsQ8K& x,
                     const int16_t* sums16, int64_t m, float* y, int64_t y_stride) {
  group_kq6x<R, false>(records, K, g, groups, x, sums16, m, y, y_stride);
}

// One row of blocks as its K float weights (a prompt's many-row product runs dense on them)
template <int64_t T>
void dequantize_gguf_row(const uint8_t* row, int64_t K, float* out) {
  over_chunks<T>(row, K, [&](const uint8_t* b, int j, int64_t k) {
    __m256 w[4];
    chunk_weights<Gguf<T>::is_signed>(Gguf<T>::chunk(b, j), w);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + k + 8 * i, w[i]);
  });
}

// run(C) for C = count (1..7) as a compile-time constant; nothing for 0
template <class Run>
void below_eight(int64_t count, Run run) {
  switch (count) {
    case 1: run(std::integral_constant<int, 1>()); break;
    case 2: run(std::integral_constant<int, 2>()); break;
    case 3: run(std::integral_constant<int, 3>()); break;
    case 4: run(std::integral_constant<int, 4>()); break;
    case 5: run(std::integral_constant<int, 5>()); break;
    case 6: run(std::integral_constant<int, 6>()); break;
    case 7: run(std::integral_constant<int, 7>()); break;
    default: break;
  }
}

// run(R, m) over M rows in groups: R = 4 while four are left, then the remaining 3, 2 or 1 (R a compile-time count)
template <class Run>
void in_fours(int64_t M, Run run) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) run(std::integral_constant<int, 4>(), m);
  switch (M - m) {
    case 3: run(std::integral_constant<int, 3>(), m); break;
    case 2: run(std::integral_constant<int, 2>(), m); break;
    case 1: run(std::integral_constant<int, 1>(), m); break;
    default: break;
  }
}

// run(R, m) over M rows in groups: R = 8 while eight are left, then the remaining 1..7 in one (R a compile-time
// count). The K-quant kernel's integer sums leave the registers for 8 rows (a verification pass reads its weights
// once).
template <class Run>
void in_eights(int64_t M, Run run) {
  int64_t m = 0;
  for (; m + 8 <= M; m += 8) run(std::integral_constant<int, 8>(), m);
  below_eight(M - m, [&](auto R) { run(R, m); });
}

// y [M, N] = x [M, K] W^T (+ bias) for GGUF blocks: output rows over torch's threads, each in its part's type, x's
// rows 4 at a time (K-quants: 8); q8: 8-bit activations, xq: x's codes in blocks of 32 (for the parts that are not
// K-quants)
bool is_kquant(int64_t type) { return type == GQ4_K || type == GQ5_K || type == GQ6_K; }

bool all_kquant(const Proj& p) {
  return std::all_of(p.parts, p.parts + p.n_parts, [](const GgufPart& part) { return is_kquant(part.type); });
}

void gemm_gguf(const Proj& p, const float* x, int64_t M, float* y, const RowsQ8* xq, bool q8) {
  RowsQ8K xk;  // K-quant parts' activations (Q8_K)
  if (q8 && std::any_of(p.parts, p.parts + p.n_parts, [](const GgufPart& part) { return is_kquant(part.type); })) {
    xk.codes.resize(M * p.K), xk.d.resize(M * (p.K / 256)), xk.sums.resize(M * (p.K / 32));
    for (int64_t r = 0; r < M; ++r)
      quantize_q8k(x + r * p.K, p.K, xk.codes.data() + r * p.K, xk.d.data() + r * (p.K / 256),
                   xk.sums.data() + r * (p.K / 32));
  }
  at::parallel_for(0, p.N, 32, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const GgufPart& part = p.part_of(n);
      const uint8_t* row = part.base + (n - part.first) * part.row_bytes;
      with_gguf_type(part.type, [&](auto T) {
        constexpr int64_t type = decltype(T)::value;
        if (q8) {
          if constexpr (type == GQ4_K || type == GQ5_K || type == GQ6_K)
            in_eights(M, [&](auto R, int64_t m) {
              rows_kquant_q8<type, decltype(R)::value>(row, p.K, xk, m, y + m * p.N, p.N, n);
            });
          else
            in_fours(M, [&](auto R, int64_t m) {
              rows_gguf_q8<type, decltype(R)::value>(row, p.K, *xq, m, y + m * p.N, p.N, n);
            });
        } else
          in_fours(M, [&](auto R, int64_t m) {
            rows_gguf<type, decltype(R)::value>(row, p.K, x + m * p.K, y + m * p.N, p.N, n);
          });
      });
      if (p.bias)
        for (int64_t r = 0; r < M; ++r) y[r * p.N + n] += p.bias[n];
    }
  });
}

// y [M, N] = x [M, K] W^T (+ bias) for KQ4X or KQ6X records: x quantized as Q8_K, 8 columns at a time over torch's
// threads, x's rows 8 at a time
void gemm_kqx(const Proj& p, const float* x, int64_t M, float* y) {
  RowsQ8K xk;
  xk.codes.resize(M * p.K), xk.d.resize(M * (p.K / 256)), xk.sums.resize(M * (p.K / 32));
  for (int64_t r = 0; r < M; ++r)
    quantize_q8k(x + r * p.K, p.K, xk.codes.data() + r * p.K, xk.d.data() + r * (p.K / 256), xk.sums.data() + r * (p.K / 32));
  std::vector<int16_t> sums16;  // KQ6X: the code sums per 16 inputs
  if (p.kind == KQ6X) {
    sums16.resize(M * (p.K / 16));
    for (int64_t i = 0; i < M * (p.K / 16); ++i) {
      int total = 0;
      for (int l = 0; l < 16; ++l) total += xk.codes[16 * i + l];
      sums16[i] = int16_t(total);
    }
  }
  at::parallel_for(0, p.N / 8, 8, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      in_eights(M, [&](auto R, int64_t m) {
        constexpr int rows = decltype(R)::value;
        if (p.kind == KQ6X && vnni_on)
          group_kq6x_vnni<rows>(p.codes, p.K, g, p.N / 8, xk, sums16.data(), m, y + m * p.N, p.N);
        else if (p.kind == KQ6X)
          group_kq6x_avx2<rows>(p.codes, p.K, g, p.N / 8, xk, sums16.data(), m, y + m * p.N, p.N);
        else if (vnni_on)
          group_kq4x_vnni<rows>(p.codes, p.K, g, p.N / 8, xk, m, y + m * p.N, p.N);
        else
          group_kq4x_avx2<rows>(p.codes, p.K, g, p.N / 8, xk, m, y + m * p.N, p.N);
      });
      if (p.bias)
        for (int64_t r = 0; r < M; ++r)
          for (int64_t n = 8 * g; n < 8 * g + 8; ++n) y[r * p.N + n] += p.bias[n];
    }
  });
}

// y [M, N] = x [M, K] W^T (+ bias), output rows spread over torch's threads, x's rows 4 at a time.
// x_sums: scratch of M * K / 32 floats. act_q8: 8-bit activations for block projections (above).
void gemm(const Proj& p, const float* x, int64_t M, float* y, float* x_sums, bool act_q8 = false) {
  RowsQ8 xq;
  const bool interleaved = p.kind == Q4X || p.kind == Q8X;
  TORCH_CHECK(act_q8 || !interleaved, "interleaved blocks run with 8-bit activations only");
  const bool q8 = act_q8 && (p.kind == Q4 || p.kind == Q8 || p.kind == GGUF || interleaved);  // others: fp32
  TORCH_CHECK(act_q8 || (p.kind != KQ4X && p.kind != KQ6X), "KQ4X / KQ6X blocks run with 8-bit activations only");
  if (q8 && !(p.kind == GGUF && all_kquant(p)) && p.kind != KQ4X && p.kind != KQ6X) {  // K-quants quantize their own (Q8_K)
    const int64_t blocks = p.K / 32;
    xq.codes.resize(M * p.K);
    xq.d.resize(M * blocks);
    xq.d_sum.resize(M * blocks);
    for (int64_t r = 0; r < M; ++r)
      quantize_q8(x + r * p.K, p.K, xq.codes.data() + r * p.K, xq.d.data() + r * blocks, xq.d_sum.data() + r * blocks);
  } else if (p.kind == Q4) {
    for (int64_t r = 0; r < M; ++r) block_sums(x + r * p.K, p.K, x_sums + r * (p.K / 32));
  }
  if (p.kind == BF16A) {
    TORCH_CHECK(amx_on, "BF16A weights need AMX, which is off here: pack them as BF16X (lean_step.amx_tiles)");
    return gemm_amx(p, x, M, y);
  }
  if (p.kind == BF16X || p.kind == I8X) {
    const bool int8 = p.kind == I8X;
    const uint8_t* base = int8 ? p.codes : reinterpret_cast<const uint8_t*>(p.half);
    const int64_t group_bytes = p.K * (int8 ? 16 : 32);
    at::parallel_for(0, p.N / 16, 4, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        const void* next = g + 1 < p.N / 16 ? base + (g + 1) * group_bytes : nullptr;
        if (avx512_on)
          in_passes<16>(M, [&](auto R, int64_t m) {
            if (int8)
              group_x16_avx512<decltype(R)::value, true>(p, g, x + m * p.K, y + m * p.N, p.N, next);
            else
              group_x16_avx512<decltype(R)::value, false>(p, g, x + m * p.K, y + m * p.N, p.N, next);
          });
        else
          in_passes<6>(M, [&](auto R, int64_t m) {
            if (int8)
              group_x16<decltype(R)::value, true>(p, g, x + m * p.K, y + m * p.N, p.N, next);
            else
              group_x16<decltype(R)::value, false>(p, g, x + m * p.K, y + m * p.N, p.N, next);
          });
        if (p.bias)
          for (int64_t r = 0; r < M; ++r)
            for (int64_t n = 16 * g; n < 16 * g + 16; ++n) y[r * p.N + n] += p.bias[n];
      }
    });
    return;
  }
  if (p.kind == GGUF) return gemm_gguf(p, x, M, y, &xq, q8);
  if (p.kind == KQ4X || p.kind == KQ6X) return gemm_kqx(p, x, M, y);
  if (interleaved) {
    at::parallel_for(0, p.N / 8, 8, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        if (vnni_on && p.kind == Q4X)
          in_eights(M, [&](auto R, int64_t m) { group_q4x_vnni<decltype(R)::value>(p, g, xq, m, y + m * p.N, p.N); });
        else if (vnni_on)
          in_eights(M, [&](auto R, int64_t m) { group_q8x_vnni<decltype(R)::value>(p, g, xq, m, y + m * p.N, p.N); });
        else if (p.kind == Q4X)
          in_fours(M, [&](auto R, int64_t m) { group_q4x<decltype(R)::value>(p, g, xq, m, y + m * p.N, p.N); });
        else
          in_fours(M, [&](auto R, int64_t m) { group_q8x<decltype(R)::value>(p, g, xq, m, y + m * p.N, p.N); });
        if (p.bias)
          for (int64_t r = 0; r < M; ++r)
            for (int64_t n = 8 * g; n < 8 * g + 8; ++n) y[r * p.N + n] += p.bias[n];
      }
    });
    return;
  }
  at::parallel_for(0, p.N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      if (q8)
        in_fours(M, [&](auto R, int64_t m) { rows_q8act<decltype(R)::value>(p, n, xq, m, y + m * p.N, p.N); });
      else
        in_fours(M, [&](auto R, int64_t m) {
          rows<decltype(R)::value>(p, n, x + m * p.K, x_sums + m * (p.K / 32), y + m * p.N, p.N);
        });
      if (p.bias)
        for (int64_t r = 0; r < M; ++r) y[r * p.N + n] += p.bias[n];
    }
  });
}

void rms_norm(const float* x, const float* w, int64_t H, double eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < H; ++i) ss += double(x[i]) * x[i];
  const float r = 1.f / std::sqrt(float(ss / H) + float(eps));
  for (int64_t i = 0; i < H; ++i) out[i] = (x[i] * r) * w[i];
}

// x * cos + rotate_half(x) * sin per head, rotate_half(x) = [-x[D/2:], x[:D/2]].
void rope(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  std::vector<float> t(D);
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * D;
    for (int64_t i = 0; i < half; ++i) {
      t[i] = v[i] * cos[i] - v[i + half] * sin[i];
      t[i + half] = v[i + half] * cos[i + half] + v[i] * sin[i + half];
    }
    std::copy(t.begin(), t.end(), v);
  }
}


// 8 cached keys' or values' numbers as floats: a float32 cache's as they are, a float16 cache's widened (exactly)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// n floats into a cache row: as they are, or rounded to float16 (to nearest even; n a multiple of 8)
inline void store_row(const float* x, int64_t n, float* out) { std::copy(x, x + n, out); }
inline void store_row(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
}

// The sums of 8 accumulators, lane k holding accumulator k's: the same tree for every lane, so a key's score does
// not depend on the keys computed beside it.
inline __m256 sums8(const __m256 a[8]) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Scores of keys j0..j0+KEYS-1 for one query (KEYS a compile-time count, so the loops unroll): each key's dot in
// its own accumulator, the 8 summed by one tree; p[k] = score * scale for k < 8 (0 beyond KEYS).
template <int KEYS, class KV>
inline void score_block(const float* q, const KV* K, int64_t D, float scale, float* p) {
  __m256 acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 qi = _mm256_loadu_ps(q + i);
    for (int k = 0; k < KEYS; ++k) acc[k] = _mm256_fmadd_ps(qi, load8(K + k * D + i), acc[k]);
  }
  _mm256_storeu_ps(p, _mm256_mul_ps(sums8(acc), _mm256_set1_ps(scale)));
}

// out[0 .. 8 W) (+)= sum over the visible keys from <= j < to of w[j] * V_j[0 .. 8 W), key after key, in
// registers; resume: out holds the sum over the keys before `from` (a block of keys after another).
template <int W, class KV>
inline void weigh_values(const float* w, const KV* V, int64_t D, const bool* visible, int64_t from, int64_t to,
                         bool resume, float* out) {
  __m256 o[W];
  for (int c = 0; c < W; ++c) o[c] = resume ? _mm256_loadu_ps(out + 8 * c) : _mm256_setzero_ps();
  for (int64_t j = from; j < to; ++j) {
    if (visible && !visible[j]) continue;
    const __m256 wj = _mm256_set1_ps(w[j]);
    for (int c = 0; c < W; ++c) o[c] = _mm256_fmadd_ps(wj, load8(V + j * D + 8 * c), o[c]);
  }
  for (int c = 0; c < W; ++c) _mm256_storeu_ps(out + 8 * c, o[c]);
}

// run(t) for each row t < T: on torch's threads where the rows are enough to pay for waking them (a row's
// arithmetic is its own either way)
template <class Run>
void rows_over_threads(int64_t T, Run run) {
  if (T < 4) {
    for (int64_t t = 0; t < T; ++t) run(t);
    return;
  }
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) run(t);
  });
}

// One query head's attention over keys 0..last of its kv head (K, V: [S, D], D a multiple of 8), `visible` hiding
// some (nullptr: none): out [D] = softmax(q . K_j * scale) . V. p: its scratch of last + 9 floats.
struct Query {
  const float* q;
  const bool* visible;
  int64_t last;
  float* p;
  float* out;
};

// Scores of keys from..to-1 (from a multiple of 8; to = last + 1, or a multiple of 8 before it), 8 keys at a time,
// then the last few: the same per-key arithmetic
template <class KV>
inline void score_keys(const Query& a, const KV* K, int64_t D, float scale, int64_t from, int64_t to) {
  const int64_t full = from + ((to - from) & ~int64_t(7));
  for (int64_t j0 = from; j0 < full; j0 += 8) score_block<8>(a.q, K + j0 * D, D, scale, a.p + j0);
  below_eight(to - full, [&](auto C) { score_block<decltype(C)::value>(a.q, K + full * D, D, scale, a.p + full); });
}

// softmax over the visible scores p[0..last] in place, the hidden ones 0
inline void normalize(const Query& a) {
  float* p = a.p;
  const int64_t n = a.last + 1;
  float top = -INFINITY;
  for (int64_t j = 0; j < n; ++j)
    if (!a.visible || a.visible[j]) top = std::max(top, p[j]);
  exp_shifted(p, n, top);
  // The total in 8 partial sums (a chain of scalar adds waits on each one): the k-th visible weight goes to sum
  // k % 8, so a tree pass, whose hidden slots sit between the visible ones, adds what a one-token step adds.
  __m256 lanes = _mm256_setzero_ps();
  if (a.visible) {
    float partial[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int64_t j = 0, rank = 0; j < n; ++j) {
      if (!a.visible[j]) {
        p[j] = 0.f;
        continue;
      }
      partial[rank++ % 8] += p[j];
    }
    lanes = _mm256_loadu_ps(partial);
  } else {
    for (int64_t j = n; j < ((n + 7) & ~int64_t(7)); ++j) p[j] = 0.f;
    for (int64_t j = 0; j < n; j += 8) lanes = _mm256_add_ps(lanes, _mm256_loadu_ps(p + j));
  }
  const __m256 total = _mm256_set1_ps(hsum(lanes));
  for (int64_t j = 0; j < n; j += 8) _mm256_storeu_ps(p + j, _mm256_div_ps(_mm256_loadu_ps(p + j), total));
}

// out (+)= the weighed values of keys from..to-1 (to <= last + 1), 64 of out's values at a time: 8 chains
template <class KV>
inline void weigh_keys(const Query& a, const KV* V, int64_t D, int64_t from, int64_t to) {
  int64_t i0 = 0;
  const bool resume = from > 0;
  for (; i0 + 64 <= D; i0 += 64) weigh_values<8>(a.p, V + i0, D, a.visible, from, to, resume, a.out + i0);
  below_eight((D - i0) / 8, [&](auto W) {
    weigh_values<decltype(W)::value>(a.p, V + i0, D, a.visible, from, to, resume, a.out + i0);
  });
}

template <class KV>
void attend(const Query& a, const KV* K, const KV* V, int64_t D, float scale) {
  score_keys(a, K, D, scale, 0, a.last + 1);
  normalize(a);
  weigh_keys(a, V, D, 0, a.last + 1);
}

// Three queries at once, for passes of several rows where the CPU has AVX-512 (whose EVEX encoding gives 32 ymm
// registers): the keys' and values' loads are shared, and each query's every number is the one its own
// score_block / weigh_values computes (the same lanes, the same chains), so a row's bits do not depend on the
// queries beside it. Keys past a query's last, or hidden from it, get weight 0 in its sums (the values are those of
// this pass's or committed slots, so finite): fma(0, v, o) is o.
template <int KEYS, class KV>
__attribute__((target("avx512f,avx512vl"))) void score_block3(const Query* a, const KV* K, int64_t D, float scale,
                                                              int64_t j0) {
  __m256 s0[8], s1[8], s2[8];
  for (int k = 0; k < 8; ++k) s0[k] = s1[k] = s2[k] = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 q0 = _mm256_loadu_ps(a[0].q + i), q1 = _mm256_loadu_ps(a[1].q + i), q2 = _mm256_loadu_ps(a[2].q + i);
    for (int k = 0; k < KEYS; ++k) {
      const __m256 kv = load8(K + (j0 + k) * D + i);
      s0[k] = _mm256_fmadd_ps(q0, kv, s0[k]);
      s1[k] = _mm256_fmadd_ps(q1, kv, s1[k]);
      s2[k] = _mm256_fmadd_ps(q2, kv, s2[k]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
  _mm256_storeu_ps(a[0].p + j0, _mm256_mul_ps(sums8(s0), sc));
  _mm256_storeu_ps(a[1].p + j0, _mm256_mul_ps(sums8(s1), sc));
  _mm256_storeu_ps(a[2].p + j0, _mm256_mul_ps(sums8(s2), sc));
}

template <int W, class KV>
__attribute__((target("avx512f,avx512vl"))) void weigh_values3(const Query* a, const KV* V, int64_t D, int64_t i0,
                                                               int64_t from, int64_t to, bool resume) {
  __m256 o0[W], o1[W], o2[W];
  for (int c = 0; c < W; ++c) {
    o0[c] = resume ? _mm256_loadu_ps(a[0].out + i0 + 8 * c) : _mm256_setzero_ps();
    o1[c] = resume ? _mm256_loadu_ps(a[1].out + i0 + 8 * c) : _mm256_setzero_ps();
    o2[c] = resume ? _mm256_loadu_ps(a[2].out + i0 + 8 * c) : _mm256_setzero_ps();
  }
  for (int64_t j = from; j < to; ++j) {
    const __m256 w0 = _mm256_set1_ps(j <= a[0].last ? a[0].p[j] : 0.f);
    const __m256 w1 = _mm256_set1_ps(j <= a[1].last ? a[1].p[j] : 0.f);
    const __m256 w2 = _mm256_set1_ps(j <= a[2].last ? a[2].p[j] : 0.f);
    for (int c = 0; c < W; ++c) {
      const __m256 v = load8(V + j * D + i0 + 8 * c);
      o0[c] = _mm256_fmadd_ps(w0, v, o0[c]);
      o1[c] = _mm256_fmadd_ps(w1, v, o1[c]);
      o2[c] = _mm256_fmadd_ps(w2, v, o2[c]);
    }
  }
  for (int c = 0; c < W; ++c) {
    _mm256_storeu_ps(a[0].out + i0 + 8 * c, o0[c]);
    _mm256_storeu_ps(a[1].out + i0 + 8 * c, o1[c]);
    _mm256_storeu_ps(a[2].out + i0 + 8 * c, o2[c]);
  }
}

// Several queries over one kv head (a pass's rows with their query heads): each gets attend's arithmetic, key by
// key in the same order, in blocks of KEY_BLOCK keys that stay in cache for all of them; three at a time where
// the CPU has AVX-512 (score_block3, weigh_values3).
constexpr int64_t KEY_BLOCK = 64;

// each(i, j0, end) for every three queries i, i+1, i+2 taken together (the first `threes`) and one(a, j0, end) for
// each other query, over the blocks of KEY_BLOCK keys that reach them (end: the block's end for them)
template <class Three, class One>
void over_key_blocks(const std::vector<Query>& queries, int64_t threes, Three each, One one) {
  int64_t keys = 0;
  for (const Query& a : queries) keys = std::max(keys, a.last + 1);
  for (int64_t j0 = 0; j0 < keys; j0 += KEY_BLOCK) {
    for (int64_t i = 0; i < threes; i += 3) {
      const int64_t most = std::max({queries[i].last, queries[i + 1].last, queries[i + 2].last}) + 1;
      if (j0 < most) each(i, j0, std::min(j0 + KEY_BLOCK, most));
    }
    for (size_t i = threes; i < queries.size(); ++i)
      if (j0 <= queries[i].last) one(queries[i], j0, std::min(j0 + KEY_BLOCK, queries[i].last + 1));
  }
}

template <class KV>
void attend_many(const std::vector<Query>& queries, const KV* K, const KV* V, int64_t D, float scale) {
  const int64_t threes = avx512_on ? int64_t(queries.size()) / 3 * 3 : 0;  // queries taken three at a time
  over_key_blocks(
      queries, threes,
      [&](int64_t i, int64_t j0, int64_t end) {
        const int64_t full = j0 + ((end - j0) & ~int64_t(7));
        for (int64_t b = j0; b < full; b += 8) score_block3<8, KV>(&queries[i], K, D, scale, b);
        below_eight(end - full, [&](auto C) { score_block3<decltype(C)::value, KV>(&queries[i], K, D, scale, full); });
      },
      [&](const Query& a, int64_t j0, int64_t end) { score_keys(a, K, D, scale, j0, end); });
  for (const Query& a : queries) normalize(a);
  over_key_blocks(
      queries, threes,
      [&](int64_t i, int64_t j0, int64_t end) {
        int64_t i0 = 0;
        for (; i0 + 64 <= D; i0 += 64) weigh_values3<8, KV>(&queries[i], V, D, i0, j0, end, j0 > 0);
        for (; i0 < D; i0 += 8) weigh_values3<1, KV>(&queries[i], V, D, i0, j0, end, j0 > 0);
      },
      [&](const Query& a, int64_t j0, int64_t end) { weigh_keys(a, V, D, j0, end); });
}

// A GGUF projection's parts from its bytes (uint8 [total]) and layout (int64 [K, type, rows, type, rows, ...])
void gguf_parts(Proj& p, const torch::Tensor& bytes, const torch::Tensor& layout) {
  TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.dim() == 1 && bytes.is_contiguous(),
              "GGUF blocks: contiguous uint8 bytes [total] expected");
  TORCH_CHECK(layout.scalar_type() == at::kLong && layout.dim() == 1 && layout.numel() % 2 == 1 &&
                  layout.numel() >= 3 && layout.numel() <= 1 + 2 * GGUF_MAX_PARTS && layout.is_contiguous(),
              "GGUF layout: int64 [K, then (type, rows) for each of 1..", GGUF_MAX_PARTS, " parts] expected");
  const int64_t* l = layout.data_ptr<int64_t>();
  p.K = l[0];
  TORCH_CHECK(p.K > 0 && p.K % 32 == 0, "GGUF rows hold whole blocks of 32 inputs");
  p.codes = bytes.data_ptr<uint8_t>();
  p.N = 0;
  p.n_parts = (layout.numel() - 1) / 2;
  int64_t offset = 0;
  for (int64_t i = 0; i < p.n_parts; ++i) {
    const int64_t type = l[1 + 2 * i], rows = l[2 + 2 * i], row_bytes = gguf_row_bytes(type, p.K);
    TORCH_CHECK(rows > 0, "a GGUF part needs rows");
    p.parts[i] = GgufPart{type, p.N, rows, row_bytes, p.codes + offset};
    offset += rows * row_bytes;
    p.N += rows;
  }
  TORCH_CHECK(offset == bytes.numel(), "GGUF blocks: ", bytes.numel(), " bytes where the layout says ", offset);
}

Proj proj_of(int64_t kind, const std::vector<torch::Tensor>& t, size_t at) {
  // t[at]: codes or the dense weight, t[at + 1]: scales (empty for F32), t[at + 2]: bias (empty for none)
  Proj p;
  p.kind = kind;
  const torch::Tensor& main = t[at];
  p.N = main.size(0);
  if (p.kind == Q4X || p.kind == Q8X) {  // [N / 8, K / 32, 128 or 256]
    TORCH_CHECK(main.dim() == 3 && main.size(2) == (p.kind == Q4X ? 128 : 256), "interleaved blocks' shape");
    p.N = main.size(0) * 8;
    p.K = main.size(1) * 32;
    p.codes = static_cast<const uint8_t*>(main.data_ptr());
  } else if (p.kind == Q4) {
    p.K = main.size(1) * 2;
    p.codes = main.data_ptr<uint8_t>();
  } else if (p.kind == Q8) {
    p.K = main.size(1);
    p.codes = reinterpret_cast<const uint8_t*>(main.data_ptr<int8_t>());
  } else if (p.kind == BF16X) {  // [N / 16, K, 16]
    TORCH_CHECK(main.dim() == 3 && main.size(2) == 16, "interleaved bf16 weight's shape");
    p.N = main.size(0) * 16;
    p.K = main.size(1);
    p.half = reinterpret_cast<const uint16_t*>(main.data_ptr<at::BFloat16>());
  } else if (p.kind == BF16A) {  // [N / 16, K / 2, 32]
    TORCH_CHECK(main.dim() == 3 && main.size(2) == 32, "AMX-tiled bf16 weight's shape");
    p.N = main.size(0) * 16;
    p.K = main.size(1) * 2;
    TORCH_CHECK(p.K % 32 == 0, "AMX tiles take inputs in chunks of 32");
    p.half = reinterpret_cast<const uint16_t*>(main.data_ptr<at::BFloat16>());
  } else if (p.kind == I8X) {  // [N / 16, K, 16]
    TORCH_CHECK(main.dim() == 3 && main.size(2) == 16, "interleaved int8 weight's shape");
    p.N = main.size(0) * 16;
    p.K = main.size(1);
    p.codes = reinterpret_cast<const uint8_t*>(main.data_ptr<int8_t>());
  } else if (p.kind == KQ4X || p.kind == KQ6X) {  // [N / 8, K / 256, KQ4X_BYTES or KQ6X_BYTES]
    TORCH_CHECK(main.dim() == 3 && main.size(2) == (p.kind == KQ4X ? KQ4X_BYTES : KQ6X_BYTES) &&
                    main.scalar_type() == at::kByte, "KQ4X / KQ6X records' shape");
    p.N = main.size(0) * 8;
    p.K = main.size(1) * 256;
    p.codes = main.data_ptr<uint8_t>();
  } else if (p.kind == GGUF) {
    gguf_parts(p, main, t[at + 1]);
  } else if (p.kind == BF16) {
    p.K = main.size(1);
    p.half = reinterpret_cast<const uint16_t*>(main.data_ptr<at::BFloat16>());
  } else {
    p.K = main.size(1);
    p.dense = main.data_ptr<float>();
  }
  if (p.kind != F32 && p.kind != BF16 && p.kind != BF16X && p.kind != BF16A && p.kind != GGUF && p.kind != KQ4X &&
      p.kind != KQ6X)
    p.scales = t[at + 1].data_ptr<float>();
  if (t[at + 2].numel()) p.bias = t[at + 2].data_ptr<float>();
  return p;
}

constexpr int64_t LAYER_TENSORS = 16;  // a layer's tensors in lean_decode's `layers` (its comment says which)

// One sequence's share of a pass: rows row0 .. row0 + rows - 1 of x, whose keys and values go to its own cache
// ([L, 1, kv_heads, S, D], float32, or float16: half the bytes every pass reads) at slots slot .. slot + rows - 1;
// seen: bool [rows, slot + rows], which slots each row attends to (nullptr: all committed ones and the new ones up
// to itself).
struct Segment {
  void* K;
  void* V;
  bool half;  // float16 caches (K, V hold uint16_t), else float32
  int64_t S, slot, row0, rows;
  const bool* seen;
};

// run(job) for jobs 0..n-1 on torch's threads, each thread taking the next job when it is free: a batch's sequences
// differ in context length, and a fixed split left one core waiting on the other's long contexts. A job's
// arithmetic is its own whichever thread runs it.
template <class Run>
void dynamic_jobs(int64_t n, Run run) {
  std::atomic<int64_t> next{0};
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t job = next.fetch_add(1); job < n; job = next.fetch_add(1)) run(job);
  });
}

// The pass itself over the rows of every segment: projections, norms and MLPs once over all rows (each weight
// read once a pass), rotary rows and cache writes per row, attention per segment over its own cache. Every row
// gets the arithmetic it would get alone. logit_rows: the rows projected to the vocabulary, in order (nullptr: all).
std::vector<torch::Tensor> run_pass(torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                                    const std::vector<Segment>& segments, int64_t L, int64_t D,
                                    const std::vector<torch::Tensor>& layers, const std::vector<torch::Tensor>& head,
                                    const std::vector<int64_t>& kinds, int64_t heads, int64_t kv_heads, double eps,
                                    bool act_q8, torch::Tensor side, torch::Tensor side_norm,
                                    const std::vector<int64_t>* logit_rows) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "float32 activations x [T, H] expected");
  x = x.contiguous();
  cos = cos.contiguous();
  sin = sin.contiguous();
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(cos.size(0) == T && cos.size(1) == D && sin.sizes() == cos.sizes(), "rotary rows [T, head_dim] expected");
  TORCH_CHECK(D % 8 == 0, "the lean step's attention reads head sizes that are multiples of 8");
  // head = [final norm] alone (and no head kind): no output projection, empty logits (a hidden-state draft's chain
  // steps, whose logits come from one product over the whole chain afterwards)
  const bool has_head = head.size() > 1;
  TORCH_CHECK(static_cast<int64_t>(layers.size()) == L * LAYER_TENSORS &&
                  static_cast<int64_t>(kinds.size()) == L * 4 + (has_head ? 1 : 0) && !head.empty(),
              "16 tensors and 4 kinds a layer, then the final norm and the head's projection (with its kind) expected");
  const bool has_side = side.numel() > 0;
  TORCH_CHECK(!has_side || (side.scalar_type() == at::kFloat && side.dim() == 2 && side.size(0) == T &&
                            side.size(1) == H && side_norm.numel() == H),
              "side: float [T, H] with a norm weight [H] expected");
  if (has_side) {
    side = side.contiguous();
    side_norm = side_norm.contiguous();
  }
  std::vector<int64_t> segment_of(T, -1);
  for (size_t i = 0; i < segments.size(); ++i)
    for (int64_t t = segments[i].row0; t < segments[i].row0 + segments[i].rows; ++t) segment_of[t] = i;
  TORCH_CHECK(std::find(segment_of.begin(), segment_of.end(), -1) == segment_of.end(), "every row needs a segment");
  if (logit_rows)
    for (int64_t r : *logit_rows) TORCH_CHECK(r >= 0 && r < T, "logit rows must be rows of the pass");
  const int64_t q_dim = heads * D, kv_dim = kv_heads * D, group = heads / kv_heads;
  const float scale = 1.f / std::sqrt(float(D));
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  int64_t widest_keys = 0;
  for (const Segment& sg : segments) widest_keys = std::max(widest_keys, sg.slot + sg.rows);

  auto states = torch::empty({L + 1, T, H}, x.options());
  float* st = states.data_ptr<float>();
  std::vector<float> h(x.data_ptr<float>(), x.data_ptr<float>() + T * H), normed(T * H), tmp(T * H);
  std::copy(h.begin(), h.end(), st);
  std::vector<float> sums, qkv, att(T * q_dim), mlp, act, joined_in;
  for (int64_t l = 0; l < L; ++l) {
    const size_t at = l * LAYER_TENSORS;
    const int64_t* kind = kinds.data() + l * 4;
    const float* in_norm = layers[at].data_ptr<float>();
    const float* post_norm = layers[at + 1].data_ptr<float>();
    const float* q_norm = layers[at + 14].numel() ? layers[at + 14].data_ptr<float>() : nullptr;
    const float* k_norm = layers[at + 15].numel() ? layers[at + 15].data_ptr<float>() : nullptr;
    TORCH_CHECK((!q_norm || layers[at + 14].numel() == D) && (!k_norm || layers[at + 15].numel() == D),
                "q / k norms of head_dim weights expected");
    Proj p_qkv = proj_of(kind[0], layers, at + 2), p_o = proj_of(kind[1], layers, at + 5);
    Proj p_gu = proj_of(kind[2], layers, at + 8), p_down = proj_of(kind[3], layers, at + 11);
    const bool joined = has_side && l == 0;  // EAGLE-3's layer: q, k, v read [norm(side), norm(h)]
    TORCH_CHECK(p_qkv.N == q_dim + 2 * kv_dim && p_gu.N == 2 * p_down.K && p_qkv.K == (joined ? 2 * H : H),
                "projection shapes");
    const int64_t widest = std::max({p_qkv.K, p_o.K, p_gu.K, p_down.K});
    sums.resize(T * (widest / 32 + 1));
    qkv.resize(T * p_qkv.N);
    mlp.resize(T * p_gu.N);
    act.resize(T * p_down.K);

    if (joined) {
      joined_in.resize(T * 2 * H);
      for (int64_t t = 0; t < T; ++t) {
        rms_norm(side.data_ptr<float>() + t * H, side_norm.data_ptr<float>(), H, eps, joined_in.data() + t * 2 * H);
        rms_norm(h.data() + t * H, in_norm, H, eps, joined_in.data() + t * 2 * H + H);
      }
      gemm(p_qkv, joined_in.data(), T, qkv.data(), sums.data(), act_q8);
    } else {
      rows_over_threads(T, [&](int64_t t) { rms_norm(h.data() + t * H, in_norm, H, eps, normed.data() + t * H); });
      gemm(p_qkv, normed.data(), T, qkv.data(), sums.data(), act_q8);
    }
    const int64_t layer_offset = l * kv_heads;  // in units of S * D, times each segment's S
    for (int64_t t = 0; t < T; ++t) {
      const Segment& sg = segments[segment_of[t]];
      float* q = qkv.data() + t * p_qkv.N;
      float* k = q + q_dim;
      float* v = k + kv_dim;
      for (int64_t g = 0; q_norm && g < heads; ++g) rms_norm(q + g * D, q_norm, D, eps, q + g * D);  // Qwen3
      for (int64_t g = 0; k_norm && g < kv_heads; ++g) rms_norm(k + g * D, k_norm, D, eps, k + g * D);
      rope(q, heads, D, c + t * D, s + t * D);
      rope(k, kv_heads, D, c + t * D, s + t * D);
      const int64_t slot = sg.slot + t - sg.row0;
      for (int64_t g = 0; g < kv_heads; ++g) {
        const int64_t at = ((layer_offset + g) * sg.S + slot) * D;
        if (sg.half) {
          store_row(k + g * D, D, static_cast<uint16_t*>(sg.K) + at);
          store_row(v + g * D, D, static_cast<uint16_t*>(sg.V) + at);
        } else {
          store_row(k + g * D, D, static_cast<float*>(sg.K) + at);
          store_row(v + g * D, D, static_cast<float*>(sg.V) + at);
        }
      }
    }
    auto query = [&](int64_t t, int64_t hq, float* p) {
      const Segment& sg = segments[segment_of[t]];
      const int64_t keys = sg.slot + sg.rows, local = t - sg.row0;
      return Query{qkv.data() + t * p_qkv.N + hq * D, sg.seen ? sg.seen + local * keys : nullptr,
                   sg.seen ? keys - 1 : sg.slot + local, p, att.data() + t * q_dim + hq * D};
    };
    // every segment's cache holds one type (lean_decode_packed checks): the attention's loads are compiled for it
    auto attention = [&](auto kv_type) {
      using KV = decltype(kv_type);
      auto keys_of = [&](const Segment& sg, int64_t g) {
        return static_cast<const KV*>(sg.K) + (layer_offset + g) * sg.S * D;
      };
      auto values_of = [&](const Segment& sg, int64_t g) {
        return static_cast<const KV*>(sg.V) + (layer_offset + g) * sg.S * D;
      };
      // Few queries (a one-token step): a job a query head, to keep the threads busy. More: a job a segment, kv head
      // and chunk of its rows, whose queries read each block of keys and values once (attend_many). Either way each
      // query gets the same arithmetic.
      const int64_t threads = at::get_num_threads();
      if (T * kv_heads < 4 * threads) {
        dynamic_jobs(T * heads, [&](int64_t job) {
          std::vector<float> p(widest_keys + 8);
          const int64_t t = job / heads, hq = job % heads, g = hq / group;
          const Segment& sg = segments[segment_of[t]];
          attend(query(t, hq, p.data()), keys_of(sg, g), values_of(sg, g), D, scale);
        });
      } else {
        struct Job { int64_t segment, g, t0, t1; };
        std::vector<Job> jobs;
        const int64_t wanted = (2 * threads + kv_heads * int64_t(segments.size()) - 1) / (kv_heads * segments.size());
        for (size_t i = 0; i < segments.size(); ++i) {
          const Segment& sg = segments[i];
          const int64_t chunks = std::min(sg.rows, std::max<int64_t>(1, wanted));
          for (int64_t g = 0; g < kv_heads; ++g)
            for (int64_t chunk = 0; chunk < chunks; ++chunk)
              jobs.push_back({int64_t(i), g, sg.row0 + sg.rows * chunk / chunks, sg.row0 + sg.rows * (chunk + 1) / chunks});
        }
        dynamic_jobs(jobs.size(), [&](int64_t index) {
          const Job& job = jobs[index];
          const Segment& sg = segments[job.segment];
          const int64_t stride = sg.slot + sg.rows + 8;
          std::vector<float> p((job.t1 - job.t0) * group * stride);
          std::vector<Query> queries;
          for (int64_t t = job.t0; t < job.t1; ++t)
            for (int64_t hq = job.g * group; hq < (job.g + 1) * group; ++hq)
              queries.push_back(query(t, hq, p.data() + queries.size() * stride));
          attend_many(queries, keys_of(sg, job.g), values_of(sg, job.g), D, scale);
        });
      }
    };
    if (segments[0].half)
      attention(uint16_t{});
    else
      attention(float{});
    gemm(p_o, att.data(), T, tmp.data(), sums.data(), act_q8);
    for (int64_t i = 0; i < T * H; ++i) h[i] += tmp[i];
    rows_over_threads(T, [&](int64_t t) { rms_norm(h.data() + t * H, post_norm, H, eps, normed.data() + t * H); });
    gemm(p_gu, normed.data(), T, mlp.data(), sums.data(), act_q8);
    const int64_t I = p_down.K;
    rows_over_threads(T, [&](int64_t t) {  // SiLU(gate) * up, gate = g: g / (1 + e^-g)
      const float* g = mlp.data() + t * 2 * I;
      float* a = act.data() + t * I;
      for (int64_t i = 0; i < I; ++i) a[i] = -g[i];
      exp_shifted(a, I, 0.f);
      for (int64_t i = 0; i < I; ++i) a[i] = g[i] / (1.f + a[i]) * g[I + i];
    });
    gemm(p_down, act.data(), T, tmp.data(), sums.data(), act_q8);
    for (int64_t i = 0; i < T * H; ++i) h[i] += tmp[i];
    if (l + 1 < L) std::copy(h.begin(), h.end(), st + (l + 1) * T * H);
  }
  auto last = torch::empty({T, H}, x.options());  // the last layer's output before the final norm
  std::copy(h.begin(), h.end(), last.data_ptr<float>());
  for (int64_t t = 0; t < T; ++t) rms_norm(h.data() + t * H, head[0].data_ptr<float>(), H, eps, normed.data() + t * H);
  std::copy(normed.begin(), normed.end(), st + L * T * H);
  if (!has_head) return {torch::empty({T, 0}, x.options()), states, last};
  Proj p_head = proj_of(kinds[L * 4], head, 1);
  const float* rows_in = normed.data();
  int64_t R = T;
  std::vector<float> picked;
  if (logit_rows) {  // only these rows' logits (a prompt chunk needs none)
    R = logit_rows->size();
    picked.resize(R * H);
    for (int64_t i = 0; i < R; ++i) {
      const int64_t row = (*logit_rows)[i];
      std::copy(normed.begin() + row * H, normed.begin() + (row + 1) * H, picked.begin() + i * H);
    }
    rows_in = picked.data();
  }
  sums.resize(R * (p_head.K / 32 + 1) + 1);
  auto logits = torch::empty({R, p_head.N}, x.options());
  if (R > 0) gemm(p_head, rows_in, R, logits.data_ptr<float>(), sums.data(), act_q8);
  return {logits, states, last};
}

Segment segment_of_cache(torch::Tensor& k_cache, torch::Tensor& v_cache, int64_t slot, int64_t row0, int64_t rows,
                         torch::Tensor& visible, int64_t L, int64_t kv_heads) {
  const bool half = k_cache.scalar_type() == at::kHalf;
  TORCH_CHECK((half || k_cache.scalar_type() == at::kFloat) && v_cache.scalar_type() == k_cache.scalar_type(),
              "float32 or float16 caches (keys and values alike) expected");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes(),
              "contiguous caches of one shape expected");
  TORCH_CHECK(k_cache.dim() == 5 && k_cache.size(0) == L && k_cache.size(1) == 1 && k_cache.size(2) == kv_heads,
              "cache shape [layers, 1, kv_heads, slots, head_dim] expected");
  const int64_t keys = slot + rows;
  TORCH_CHECK(slot >= 0 && keys <= k_cache.size(3), "the pass's slots run past the cache");
  TORCH_CHECK(visible.numel() == 0 || (visible.scalar_type() == at::kBool && visible.dim() == 2 &&
                                       visible.size(0) == rows && visible.size(1) == keys),
              "visible: bool [T, slot + T] expected");
  visible = visible.contiguous();
  return Segment{k_cache.data_ptr(), v_cache.data_ptr(), half, k_cache.size(3), slot, row0, rows,
                 visible.numel() ? visible.data_ptr<bool>() : nullptr};
}

}  // namespace

// A pass of T new tokens (a one-token step, or a verification pass of a few rows) after the cache's first `slot`
// slots. x: [T, H] their embeddings; cos, sin: [T, D] their rotary rows; k_cache, v_cache: [L, 1, Hkv, S, D] float,
// the new keys and values go to slots slot..slot+T-1; visible: bool [T, slot + T], which slots each new token
// attends to (empty: all committed ones and the new ones up to itself). layers: per layer 2 norms, 4 projections
// (qkv, o, gate_up, down) as (codes or dense, scales, bias), then the RMSNorm weights [D] of each query and key head
// before rotary (Qwen3; empty: none), LAYER_TENSORS in all; head: the final norm, then the output
// projection (or the final norm alone: no logits); kinds: the projections' kinds, 4 a layer then the head's.
// side, side_norm (empty: none): EAGLE-3's head, whose one layer reads q, k and v from [norm(side), norm(x)] (the
// token embeddings beside the hidden states) and keeps x as its residual.
// Returns (logits [T, V], states [L + 1, T, H]: the embeddings, each layer's output but the last, the final normed
// states; and the last layer's output before the final norm [T, H]). Every row gets the arithmetic it would get
// alone: a token verified in a pass and the same token decoded in a one-token step compute the same numbers.
std::vector<torch::Tensor> lean_decode(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, torch::Tensor k_cache,
                                       torch::Tensor v_cache, int64_t slot, torch::Tensor visible,
                                       std::vector<torch::Tensor> layers, std::vector<torch::Tensor> head,
                                       std::vector<int64_t> kinds, int64_t heads, int64_t kv_heads, double eps,
                                       bool act_q8, torch::Tensor side, torch::Tensor side_norm) {
  TORCH_CHECK(x.dim() == 2, "float32 activations x [T, H] expected");
  const int64_t L = k_cache.size(0), D = k_cache.size(4);
  const std::vector<Segment> segments = {segment_of_cache(k_cache, v_cache, slot, 0, x.size(0), visible, L, kv_heads)};
  return run_pass(x, cos, sin, segments, L, D, layers, head, kinds, heads, kv_heads, eps, act_q8, side, side_norm,
                  nullptr);
}

// One pass over several sequences' rows (continuous batching): x [T, H] holds segment 0's rows, then segment 1's,
// ...; segment i writes its own caches k_caches[i], v_caches[i] ([L, 1, Hkv, S_i, D]) after its first slots[i]
// slots, with visibles[i] as lean_decode's `visible` (empty: causal). The weights are read once for all rows.
// logit_rows: the rows projected to the vocabulary, in order (empty: none). side, side_norm: as lean_decode's, side
// [T, H] holding every segment's rows in x's order (EAGLE-3 heads' steps for several requests). Returns (logits [len(logit_rows), V],
// states [L + 1, T, H], the last layer's output before the final norm [T, H]); each row's numbers are those of
// lean_decode over its sequence alone.
std::vector<torch::Tensor> lean_decode_packed(torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                                              std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches,
                                              std::vector<int64_t> slots, std::vector<int64_t> rows,
                                              std::vector<torch::Tensor> visibles, std::vector<torch::Tensor> layers,
                                              std::vector<torch::Tensor> head, std::vector<int64_t> kinds,
                                              int64_t heads, int64_t kv_heads, double eps, bool act_q8,
                                              std::vector<int64_t> logit_rows, torch::Tensor side,
                                              torch::Tensor side_norm) {
  const size_t n = k_caches.size();
  TORCH_CHECK(n > 0 && v_caches.size() == n && slots.size() == n && rows.size() == n && visibles.size() == n,
              "one cache pair, slot, row count and mask a segment expected");
  TORCH_CHECK(x.dim() == 2, "float32 activations x [T, H] expected");
  const int64_t L = k_caches[0].size(0), D = k_caches[0].size(4);
  std::vector<Segment> segments;
  int64_t row0 = 0;
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(rows[i] > 0, "every segment needs a row");
    TORCH_CHECK(k_caches[i].dim() == 5 && k_caches[i].size(4) == D, "all caches of one model expected");
    segments.push_back(segment_of_cache(k_caches[i], v_caches[i], slots[i], row0, rows[i], visibles[i], L, kv_heads));
    row0 += rows[i];
  }
  TORCH_CHECK(row0 == x.size(0), "the segments' rows must add up to x's");
  for (const Segment& sg : segments) TORCH_CHECK(sg.half == segments[0].half, "all caches of one type expected");
  return run_pass(x, cos, sin, segments, L, D, layers, head, kinds, heads, kv_heads, eps, act_q8, side, side_norm,
                  &logit_rows);
}

// y [M, N] = x [M, K] W^T for W as Q4 or Q8 blocks, GGUF blocks (codes: the bytes, scales: the layout), a BF16 weight
// or I8X columns (kind, codes, scales as above; a BF16 weight's scales empty): the products of a pass over the same weights as the lean step, with the same
// per-row arithmetic.
torch::Tensor block_gemm(torch::Tensor x, int64_t kind, torch::Tensor codes, torch::Tensor scales, bool act_q8) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x float32 [M, K] expected");
  TORCH_CHECK(kind == Q4 || kind == Q8 || kind == Q4X || kind == Q8X || kind == BF16 || kind == BF16X || kind == I8X ||
                  kind == BF16A || kind == GGUF || kind == KQ4X || kind == KQ6X,
              "Q4 or Q8 blocks, GGUF blocks, a bf16 weight or interleaved int8 columns expected");
  x = x.contiguous();
  const std::vector<torch::Tensor> parts = {codes.contiguous(), scales.contiguous(), torch::empty({0})};
  Proj p = proj_of(kind, parts, 0);
  TORCH_CHECK(x.size(1) == p.K && (p.K % 32 == 0 || kind == BF16 || kind == BF16X || kind == I8X),
              "x's width does not match the weight");
  const int64_t M = x.size(0);
  auto y = torch::empty({M, p.N}, x.options());
  std::vector<float> sums(M * (p.K / 32) + 1);
  gemm(p, x.data_ptr<float>(), M, y.data_ptr<float>(), sums.data(), act_q8);
  return y;
}

// The float32 weight [N, K] of Q4 blocks (w = d * code + m): a prompt's many-row product runs dense on it, and
// PyTorch's unpacking of the codes cost ~1.3 ms a projection per prompt (runtime/lean_step.dequantize_q4).
torch::Tensor dequantize_q4(torch::Tensor codes, torch::Tensor dm) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && dm.scalar_type() == at::kFloat && codes.dim() == 2,
              "Q4 blocks expected: codes uint8 [N, K / 2], dm float [N, K / 32, 2]");
  codes = codes.contiguous();
  dm = dm.contiguous();
  const int64_t N = codes.size(0), K = codes.size(1) * 2, blocks = K / 32;
  TORCH_CHECK(dm.numel() == N * blocks * 2, "dm does not match the codes");
  auto out = torch::empty({N, K}, dm.options());
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const float* s = dm.data_ptr<float>();
  float* w = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    const __m128i low4 = _mm_set1_epi8(0x0F);
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t b = 0; b < blocks; ++b) {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + n * (K / 2) + 16 * b));
        const __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
        const __m256 q[4] = {bytes_u8(lo), bytes_u8(_mm_srli_si128(lo, 8)), bytes_u8(hi),
                             bytes_u8(_mm_srli_si128(hi, 8))};
        const __m256 d = _mm256_set1_ps(s[(n * blocks + b) * 2]), m = _mm256_set1_ps(s[(n * blocks + b) * 2 + 1]);
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(w + n * K + 32 * b + 8 * j, _mm256_fmadd_ps(q[j], d, m));
      }
    }
  });
  return out;
}

// The float32 weight [N, K] of GGUF blocks (bytes, layout as the GGUF kind reads them): chunk_weights' values, the
// reference dequantization's up to one rounding (a prompt's many-row product runs dense on it)
torch::Tensor dequantize_gguf(torch::Tensor bytes, torch::Tensor layout) {
  Proj p;
  p.kind = GGUF;
  bytes = bytes.contiguous();
  layout = layout.contiguous();
  gguf_parts(p, bytes, layout);
  auto out = torch::empty({p.N, p.K}, torch::kFloat);
  float* w = out.data_ptr<float>();
  at::parallel_for(0, p.N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const GgufPart& part = p.part_of(n);
      const uint8_t* row = part.base + (n - part.first) * part.row_bytes;
      with_gguf_type(part.type, [&](auto T) { dequantize_gguf_row<decltype(T)::value>(row, p.K, w + n * p.K); });
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("block_gemm", &block_gemm, "x fp32 [M, K] times a block or packed weight -> fp32 [M, N]", py::arg("x"),
        py::arg("kind"), py::arg("codes"), py::arg("scales"), py::arg("act_q8") = false,
        py::call_guard<py::gil_scoped_release>());
  m.def("dequantize_q4", &dequantize_q4, "Q4_1 blocks -> the float32 weight [N, K]",
        py::call_guard<py::gil_scoped_release>());
  m.def("interleave_q4k", &interleave_q4k, "Q4_K rows (bytes, N, K) -> KQ4X records [N / 8, K / 256, 1184]",
        py::call_guard<py::gil_scoped_release>());
  m.def("interleave_q6k", &interleave_q6k, "Q6_K rows (bytes, N, K) -> KQ6X records [N / 8, K / 256, 1680]",
        py::call_guard<py::gil_scoped_release>());
  m.def("dequantize_gguf", &dequantize_gguf, "GGUF blocks (bytes, layout) -> the float32 weight [N, K]",
        py::call_guard<py::gil_scoped_release>());
  m.def("lean_avx512", &lean_avx512, "BF16X / I8X products on AVX-512 (the default where the CPU has it): "
        "whether they now are");
  m.def("lean_prefetch", &lean_prefetch, "how many groups of 8 columns ahead the interleaved products fetch their "
        "weights (0: off, for A/B runs); returns it", py::arg("groups"));
  m.def("lean_vnni", &lean_vnni, "Q4X / Q8X products on AVX-512 VNNI (the default where the CPU has it): whether "
        "they now are");
  m.def("lean_amx", &lean_amx, "BF16A products on AMX (the default where the CPU has it and Linux grants its "
        "tile state): whether they now are");
  m.def("amx_enabled", [] { return amx_on; }, "whether BF16A products now run on AMX");
  m.def("lean_decode", &lean_decode, "a pass of a few tokens through a Llama-shaped model, fp32 activations",
        py::call_guard<py::gil_scoped_release>());  // other Python threads (a server's) run meanwhile
  m.def("lean_decode_packed", &lean_decode_packed, "one pass over several sequences' rows, each with its own cache",
        py::call_guard<py::gil_scoped_release>());
}
