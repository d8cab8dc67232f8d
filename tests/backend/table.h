// The rows of the cross-backend op table, one function per group of ops (tests/backend/
// table_<group>.cpp); the runner (test_ops.cpp) concatenates them.
#pragma once

#include <vector>

#include "backend/harness.h"

namespace leantune::backend_test {

std::vector<Entry> engine_op_entries();  // copies, fills, elementwise, reductions, softmax, gemm
std::vector<Entry> optim_entries();      // fused AdamW, the AdamW class, 8-bit and paged AdamW
std::vector<Entry> layer_entries();      // rms_norm, rope, swiglu, geglu, residual_add, dropout,
                                         // embedding
std::vector<Entry> linear_entries();     // linear, kv_cache_write, NF4/int8 weights and products
std::vector<Entry> loss_entries();       // cross_entropy, vocab blocks, linear_cross_entropy,
                                         // linear_divergence
std::vector<Entry> attention_entries();  // varlen attention
std::vector<Entry> ring_entries();       // zigzag ring attention over a thread ring

}  // namespace leantune::backend_test
