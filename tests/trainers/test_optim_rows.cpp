// Optimizer::update_rows (the LM head updated block by block inside the fused loss) against
// update_param with the same gradient: bit-identical parameters and states for every optim that
// supports it (adamw_torch, adamw_8bit with 8-bit and 32-bit states, paged_adamw_8bit staged
// through the paging pipeline, sgd, each with offload_optimizer cpu), f32 and bf16 weights, over
// three steps, in blocks that do not divide the rows; 8-bit blocks off the 256-element state
// blocks are an error; adafactor does not take rows.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/optim.h"
#include "kernels/optim_8bit.h"
#include "testing/testing.h"
#include "trainers/common/optim_options.h"

namespace leantune {
namespace {

struct Case {
  std::string name;
  std::string optim;
  std::string offload;
  DType dt;
  int64_t rows, cols, block;
  bool stage_on_host = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) { return p.param.name; }

std::unique_ptr<Optimizer> build(const Case& c, const Tensor& p) {
  const AdamWConfig cfg{1e-2, 0.9, 0.999, 1e-8, 0.1};
  std::vector<Optimizer::Param> params{{"lm_head.weight", p, true}};
  if (c.stage_on_host) {
    kernels::AdamW8bitOptions o;
    o.paged = true;
    o.stage_on_host = true;
    o.slab_elements = 512;
    return std::make_unique<kernels::AdamW8bit>(std::move(params), cfg, o);
  }
  return make_optimizer(OptimArguments{c.optim, true, c.offload}, std::move(params), cfg);
}

class OptimRows : public ::testing::TestWithParam<Case> {};

TEST_P(OptimRows, RowBlocksEqualTheWholeUpdate) {
  const Case c = GetParam();
  Tensor a = testing::randn({c.rows, c.cols}, c.dt, 1, Device::cpu(), 0.5);
  Tensor b = a.clone();
  std::unique_ptr<Optimizer> whole = build(c, a), rows = build(c, b);
  ASSERT_TRUE(rows->supports_row_updates());
  for (int step = 1; step <= 3; ++step) {
    const Tensor g = testing::randn({c.rows, c.cols}, c.dt, 100 + step, Device::cpu(), 0.1);
    a.set_grad(g.clone());
    whole->begin_step();
    whole->update_param(0, 1e-2);
    a.zero_grad();
    rows->begin_step();
    for (int64_t r0 = 0; r0 < c.rows; r0 += c.block) {
      const int64_t n = std::min(c.block, c.rows - r0);
      rows->update_rows(0, r0, g.narrow(0, r0, n).clone(), 1e-2);
    }
    ASSERT_TRUE(testing::all_close(b, a, 0.0, 0.0)) << "step " << step;
  }
  const auto sa = whole->state_tensors(), sb = rows->state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_TRUE(testing::all_close(sb[i].second, sa[i].second, 0.0, 0.0)) << sa[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optims, OptimRows,
    ::testing::Values(Case{"adamw_torch_f32", "adamw_torch", "none", DType::kF32, 19, 13, 7},
                      Case{"adamw_torch_bf16", "adamw_torch", "none", DType::kBF16, 71, 19, 16},
                      Case{"sgd_bf16", "sgd", "none", DType::kBF16, 19, 13, 5},
                      Case{"adamw_8bit_bf16", "adamw_8bit", "none", DType::kBF16, 96, 64, 12},
                      Case{"adamw_8bit_small_f32", "adamw_8bit", "none", DType::kF32, 19, 13, 7},
                      Case{"paged_adamw_8bit_staged", "paged_adamw_8bit", "none", DType::kBF16, 96,
                           64, 20, true},
                      Case{"adamw_torch_offloaded", "adamw_torch", "cpu", DType::kBF16, 19, 13, 4},
                      Case{"adamw_8bit_offloaded", "adamw_8bit", "cpu", DType::kBF16, 96, 64, 8}),
    case_name);

TEST(OptimRowsChecks, EightBitBlocksOffTheStateBlocksAndAdafactorRefuse) {
  Tensor p = testing::randn({96, 64}, DType::kBF16, 2);
  auto opt =
      make_optimizer(OptimArguments{"adamw_8bit", true, "none"}, {{"w", p, true}}, AdamWConfig{});
  opt->begin_step();
  // 3 rows of 64 = 192 elements: not a multiple of 256.
  EXPECT_THROW(opt->update_rows(0, 0, Tensor::zeros({3, 64}, DType::kBF16), 1e-3), Error);
  EXPECT_THROW(opt->update_rows(0, 0, Tensor::zeros({4, 63}, DType::kBF16), 1e-3), Error);
  auto ada =
      make_optimizer(OptimArguments{"adafactor", true, "none"}, {{"w", p, true}}, AdamWConfig{});
  EXPECT_FALSE(ada->supports_row_updates());
  EXPECT_THROW(ada->update_rows(0, 0, Tensor::zeros({4, 64}, DType::kBF16), 1e-3), Error);
}

}  // namespace
}  // namespace leantune
