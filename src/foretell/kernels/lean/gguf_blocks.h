// A GGUF file's block types as the kernels decode them, and their rows' products: float activations for
// every type, 8-bit activations for the 32-input types (K-quants: kquants.h).
#pragma once

#include "common.h"
#include "act_q8.h"

namespace {

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

// Per type Gguf<T>: inputs a block (values), a block's bytes, whether its codes are signed, and chunk(block, j)

// The 32-input types, one layout: d, then m (Q4_1, Q5_1), then 4 bytes of fifth bits (Q5_0, Q5_1; input i: bit i),
// then the codes (16 bytes of nibbles; Q8_0: 32 int8). The signed types' codes are unsigned in the file, with an
// offset (Q4_0: 8, Q5_0: 16) that chunk takes off and codes_q8 leaves on.
template <int64_t T>
struct Blocks32 {
  static_assert(T == GQ4_0 || T == GQ4_1 || T == GQ5_0 || T == GQ5_1 || T == GQ8_0, "a 32-input block type");
  static constexpr bool has_m = T == GQ4_1 || T == GQ5_1, has_fifth = T == GQ5_0 || T == GQ5_1;
  static constexpr int64_t codes_at = 2 + (has_m ? 2 : 0) + (has_fifth ? 4 : 0);
  static constexpr int64_t values = 32, bytes = codes_at + (T == GQ8_0 ? 32 : 16);
  static constexpr bool is_signed = !has_m;
  static constexpr int offset = T == GQ4_0 ? 8 : T == GQ5_0 ? 16 : 0;
  static __m256i stored_codes(const uint8_t* b) {  // as the file has them (Q4_0, Q5_0 with their offset)
    if constexpr (T == GQ8_0) return load32(b + codes_at);
    else if constexpr (has_fifth) return _mm256_or_si256(nibbles16(b + codes_at), fifth_bits(b + codes_at - 4));
    else return nibbles16(b + codes_at);
  }
  static Chunk chunk(const uint8_t* b, int) {
    const float d = half_float(b);
    if constexpr (offset != 0) return {_mm256_sub_epi8(stored_codes(b), _mm256_set1_epi8(offset)), d, d, 0.f};
    else return {stored_codes(b), d, d, has_m ? half_float(b + 2) : 0.f};
  }
};

template <int64_t T>
struct Gguf : Blocks32<T> {};  // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; the K-quants below

// Q4_K: d, dmin, 12 bytes of scales and mins, 128 of codes: chunks 2i and 2i + 1 are the low and high nibbles of
// bytes 32i .. 32i + 31. Q5_K: as Q4_K, with 32 bytes of fifth bits before the codes: input l of chunk j has bit j
// of byte l.
template <int64_t T>
struct KWithMins {
  static constexpr bool has_fifth = T == GQ5_K;
  static constexpr int64_t values = 256, bytes = has_fifth ? 176 : 144;
  static constexpr bool is_signed = false;
  static __m256i codes(const uint8_t* b, int j) {
    if constexpr (has_fifth) {
      const __m256i fifth = _mm256_slli_epi16(bit_field(b + 16, j, 1), 4);
      return _mm256_or_si256(nibbles32(b + 48 + 32 * (j / 2), j & 1), fifth);
    } else {
      return nibbles32(b + 16 + 32 * (j / 2), j & 1);
    }
  }
  static Chunk chunk(const uint8_t* b, int j) {
    int scale, min;
    scale_min_k(j, b + 4, scale, min);
    const float d = half_float(b) * float(scale);
    return {codes(b, j), d, d, -(half_float(b + 2) * float(min))};
  }
};

template <>
struct Gguf<GQ4_K> : KWithMins<GQ4_K> {};

template <>
struct Gguf<GQ5_K> : KWithMins<GQ5_K> {};

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
  using G = Gguf<T>;
  const float d = half_float(b);
  if constexpr (G::offset != 0) return {G::stored_codes(b), d, d, -float(G::offset) * d};
  else return G::chunk(b, 0);  // Q4_1, Q5_1: unsigned codes and m already; Q8_0: signed
}

template <int64_t T, int R>
void rows_gguf_q8(const uint8_t* row, int64_t K, const RowsQ8& x, int64_t m, float* y, int64_t y_stride, int64_t n) {
  static_assert(Gguf<T>::values == 32, "K-quants take rows_kquant_q8");
  constexpr bool SIGNED = T == GQ8_0;
  const int64_t blocks = K / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  over_blocks<R, true>(blocks, y + n, y_stride, [&](int64_t block, __m256* acc, float* offsets) {
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
  });
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

}  // namespace
