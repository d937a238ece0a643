// A projection's tensors as a Proj, and its product y = x W^T (+ bias) by kind.
#pragma once

#include "common.h"
#include "act_q8.h"
#include "rows.h"
#include "columns.h"
#include "columns_avx512.h"
#include "amx.h"
#include "vnni.h"
#include "interleaved.h"
#include "gguf.h"
#include "kq4x.h"
#include "kq6x.h"

namespace {

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
// x_sums: scratch of M * K / 32 floats. act_q8: 8-bit activations for block projections (act_q8.h).
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

}  // namespace
