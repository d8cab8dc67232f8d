// GPU tier for the host-offloaded optimizer (engine/optim_offload.h, --offload_optimizer cpu) on
// a device: the gradients come down and the weights go up asynchronously through pinned buffers
// on a copy stream, overlapped with the CPU step. The step itself runs on the host in both
// cases, so a model on the device must end with the same weights and host states as the same
// model on the host, to the last bit: with every parameter at once (the step after backward,
// several parameters in flight: one is larger than the download window allows together with
// the others), and one parameter at a time (optimizer_in_backward's update_param).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/optim.h"
#include "engine/optim_offload.h"
#include "testing/testing.h"

namespace leantune {
namespace {

const Device kGpu = Device::cuda(0);

struct OffloadCase {
  std::string name;
  DType dtype;
  bool per_param;
};

class OffloadedOptimizerCuda : public ::testing::TestWithParam<OffloadCase> {};

TEST_P(OffloadedOptimizerCuda, AsyncCopiesGiveTheHostResultBitForBit) {
  LT_SKIP_WITHOUT_CUDA();
  const OffloadCase& c = GetParam();
  // 64 Mi elements of bf16 are 128 MiB: with the others above kOffloadWindowBytes in flight.
  const std::vector<Shape> shapes = {{71, 229}, {19}, {8192, 8192}, {4097}, {1}};
  std::vector<Optimizer::Param> host, dev;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Tensor p = testing::randn(shapes[i], c.dtype, 60 + i, Device::cpu(), 0.1);
    host.push_back({"p" + std::to_string(i), p.clone(), i % 2 == 0});
    dev.push_back({"p" + std::to_string(i), p.to(kGpu), i % 2 == 0});
  }
  const AdamWConfig cfg{1e-3, 0.9, 0.999, 1e-8, 0.1};
  auto inner = [&](std::vector<Optimizer::Param> ps) {
    return std::make_unique<AdamW>(std::move(ps), cfg);
  };
  OffloadedOptimizer oh(host, inner), od(dev, inner);
  for (int s = 1; s <= 3; ++s) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Tensor g = testing::randn(shapes[i], c.dtype, 100 * s + i, Device::cpu(), 0.01);
      host[i].tensor.set_grad(g);
      dev[i].tensor.set_grad(g.to(kGpu));
    }
    if (c.per_param) {
      oh.begin_step();
      od.begin_step();
      for (size_t i = shapes.size(); i-- > 0;) {
        oh.update_param(i, 1e-3 * s);
        od.update_param(i, 1e-3 * s);
      }
    } else {
      oh.step(1e-3 * s, 0.5);
      od.step(1e-3 * s, 0.5);
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      host[i].tensor.zero_grad();
      dev[i].tensor.zero_grad();
      EXPECT_EQ(testing::bytes_of(dev[i].tensor), testing::bytes_of(host[i].tensor))
          << host[i].name << ", step " << s;
    }
  }
  const auto sh = oh.state_tensors(), sd = od.state_tensors();
  ASSERT_EQ(sh.size(), sd.size());
  for (size_t k = 0; k < sd.size(); ++k) {
    EXPECT_TRUE(sd[k].second.device().is_cpu()) << sd[k].first;
    EXPECT_EQ(testing::bytes_of(sd[k].second), testing::bytes_of(sh[k].second)) << sd[k].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, OffloadedOptimizerCuda,
                         ::testing::Values(OffloadCase{"bf16_step", DType::kBF16, false},
                                           OffloadCase{"bf16_per_param", DType::kBF16, true},
                                           OffloadCase{"f32_step", DType::kF32, false}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace leantune
