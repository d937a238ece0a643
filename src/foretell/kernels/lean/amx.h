// Kind BF16A: bf16 products on AMX tiles (the instruction set's switch: lean_amx).
#pragma once

#include "common.h"

namespace {

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

// y [M, N] = x [M, K] W^T (+ bias) for BF16A (on AMX only: lean_amx(False) turns BF16A products off)
void gemm_bf16a(const Proj& p, const float* x, int64_t M, float* y, float*, bool) {
  TORCH_CHECK(amx_on, "BF16A weights need AMX, which is off here: pack them as BF16X (lean_step.amx_tiles)");
  gemm_amx(p, x, M, y);
}

void unpack_bf16a(Proj& p, const torch::Tensor& main, const torch::Tensor&) {  // [N / 16, K / 2, 32]
  TORCH_CHECK(main.dim() == 3 && main.size(2) == 32, "AMX-tiled bf16 weight's shape");
  p.N = main.size(0) * 16;
  p.K = main.size(1) * 2;
  TORCH_CHECK(p.K % 32 == 0, "AMX tiles take inputs in chunks of 32");
  p.half = reinterpret_cast<const uint16_t*>(main.data_ptr<at::BFloat16>());
}

}  // namespace
