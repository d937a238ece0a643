// The kinds of weight a projection comes in, one row each: how its tensors unpack into a Proj, and its product.
// A new kind: its number in Kind (common.h, as kernels/__init__.py numbers it), its header (layout, products,
// packer: as kq4x.h) and its row here.
#pragma once

#include "common.h"
#include "rows.h"
#include "columns.h"
#include "amx.h"
#include "interleaved.h"
#include "gguf.h"
#include "kq4x.h"
#include "kq6x.h"

namespace {

struct KindRow {
  Kind kind;
  // main: codes, the dense weight or the records; scales: their scales, or a GGUF projection's layout (empty where
  // the kind has neither). Sets p's K, its pointers and, where main's first dimension is not N, its N.
  void (*unpack)(Proj& p, const torch::Tensor& main, const torch::Tensor& scales);
  // y [M, N] = x [M, K] W^T (+ bias). x_sums: scratch of M * K / 32 floats; act_q8: 8-bit activations, for the kinds
  // that take them (the interleaved kinds need them, the dense ones ignore them)
  void (*product)(const Proj& p, const float* x, int64_t M, float* y, float* x_sums, bool act_q8);
  bool block_gemm;  // block_gemm multiplies it (F32's dense weight goes through PyTorch's products there)
  int64_t inputs;   // block_gemm: K a multiple of this
};

constexpr KindRow KINDS[] = {
    {Q4, unpack_q4, gemm_rows<Q4>, true, 32},
    {Q8, unpack_q8, gemm_rows<Q8>, true, 32},
    {F32, unpack_f32, gemm_rows<F32>, false, 1},
    {Q4X, unpack_interleaved<true>, gemm_interleaved<true>, true, 32},
    {Q8X, unpack_interleaved<false>, gemm_interleaved<false>, true, 32},
    {BF16, unpack_bf16, gemm_rows<BF16>, true, 1},
    {BF16X, unpack_bf16x, gemm_columns<false>, true, 1},
    {I8X, unpack_i8x, gemm_columns<true>, true, 1},
    {BF16A, unpack_bf16a, gemm_bf16a, true, 32},
    {GGUF, gguf_parts, gemm_gguf, true, 32},
    {KQ4X, unpack_records<Kq4x>, gemm_records<Kq4x>, true, 32},
    {KQ6X, unpack_records<Kq6x>, gemm_records<Kq6x>, true, 32},
};
constexpr int64_t KINDS_N = sizeof(KINDS) / sizeof(KINDS[0]);

constexpr bool kinds_in_order() {
  for (int64_t i = 0; i < KINDS_N; ++i)
    if (KINDS[i].kind != i) return false;
  return true;
}
static_assert(kinds_in_order(), "KINDS holds one row a Kind, in Kind's numbering");

bool is_kind(int64_t kind) { return kind >= 0 && kind < KINDS_N; }

Proj proj_of(int64_t kind, const std::vector<torch::Tensor>& t, size_t at) {
  // t[at]: codes or the dense weight, t[at + 1]: scales (empty for F32), t[at + 2]: bias (empty for none)
  TORCH_CHECK(is_kind(kind), "projection kind ", kind, " is none of the kernel's (0..", KINDS_N - 1, ")");
  Proj p;
  p.kind = kind;
  const torch::Tensor& main = t[at];
  p.N = main.size(0);
  KINDS[kind].unpack(p, main, t[at + 1]);
  if (t[at + 2].numel()) p.bias = t[at + 2].data_ptr<float>();
  return p;
}

// y [M, N] = x [M, K] W^T (+ bias), in p's kind's product. x_sums: scratch of M * K / 32 floats. act_q8: 8-bit
// activations for block projections (act_q8.h).
void gemm(const Proj& p, const float* x, int64_t M, float* y, float* x_sums, bool act_q8 = false) {
  KINDS[p.kind].product(p, x, M, y, x_sums, act_q8);
}

}  // namespace
