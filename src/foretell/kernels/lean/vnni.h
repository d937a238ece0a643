// AVX-512 VNNI's switch (lean_vnni); each 8-bit kind's VNNI sums sit beside its AVX2 ones.
#pragma once

#include "common.h"

namespace {

// The same two layouts with AVX-512 VNNI (where the CPU has it): vpdpbusd multiplies 4 unsigned codes by 4 signed
// ones and adds the 4 products to a 32-bit lane in one instruction, where AVX2 needs maddubs, an add and (per block)
// a madd. The integer sums are exact either way, so both paths give a block the same total and a row the same bits
// (lean_vnni switches, for that test); with 32 registers a pass takes up to 8 rows.
bool vnni_on = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");

bool lean_vnni(bool on) {
  vnni_on = on && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
  return vnni_on;
}

}  // namespace
