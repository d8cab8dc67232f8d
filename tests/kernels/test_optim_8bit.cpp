// 8-bit AdamW against bitsandbytes 0.50.2 (tests/fixtures/gen_optim_fixtures.py ->
// tests/fixtures/optim/adamw8bit.safetensors): the two dynamic maps, the blockwise
// quantization and dequantization of states (full and short blocks, signed and unsigned), and
// three optimizer steps of an 8-bit parameter (16 full blocks + one of 32) and of a 32-bit one
// (below min_8bit_size): parameters, codes and absmax equal to the last bit. Then a restart from
// saved state continues bit for bit, and the state bytes are what the header promises.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "engine/allocator.h"
#include "kernels/optim_8bit.h"
#include "kernels/quant.h"
#include "loaders/safetensors.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using kernels::AdamW8bit;

std::shared_ptr<SafetensorsFile> fixture() {
  static std::shared_ptr<SafetensorsFile> f =
      SafetensorsFile::open(testing::fixture_path("optim/adamw8bit.safetensors"));
  return f;
}
Tensor fx(const std::string& name) { return fixture()->tensor(name).contiguous(); }

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint8_t> v(c.nbytes());
  if (!v.empty()) std::memcpy(v.data(), c.data_ptr(), v.size());
  return v;
}

// Bit equality with the index of the first difference in the message.
void expect_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const std::vector<uint8_t> a = bytes_of(got), b = bytes_of(want);
  const size_t es = got.element_size();
  for (size_t i = 0; i < a.size(); i += es)
    if (std::memcmp(&a[i], &b[i], es) != 0) {
      ADD_FAILURE() << what << ": element " << i / es << " of " << got.numel() << " differs ("
                    << got.to(DType::kF64).to_f64()[i / es] << " vs "
                    << want.to(DType::kF64).to_f64()[i / es] << ")";
      return;
    }
}

TEST(Optim8bit, MapsAreBitsandbytesDynamicMaps) {
  Tensor s = Tensor::empty({256}, DType::kF32, Device::cpu());
  Tensor u = Tensor::empty({256}, DType::kF32, Device::cpu());
  std::memcpy(s.data_ptr(), kernels::kDynamicMap, 256 * sizeof(float));
  std::memcpy(u.data_ptr(), kernels::kDynamicMapUnsigned, 256 * sizeof(float));
  expect_bits(s, fx("qmap1"), "signed map");
  expect_bits(u, fx("qmap2"), "unsigned map");
}

class Optim8bitQuant : public ::testing::TestWithParam<std::string> {};

TEST_P(Optim8bitQuant, CodesAbsmaxAndDequantMatchBitsandbytes) {
  const std::string c = "quant." + GetParam();
  const bool signed_map = GetParam()[0] == 's';
  const Tensor x = fx(c + ".x");
  const int64_t n = x.numel(), blocks = (n + 255) / 256;
  Tensor q = Tensor::empty({n}, DType::kU8, Device::cpu());
  Tensor absmax = Tensor::empty({blocks}, DType::kF32, Device::cpu());
  kernels::optim8_quantize(x, signed_map, q, absmax);
  expect_bits(q, fx(c + ".q"), c + ".q");
  expect_bits(absmax, fx(c + ".absmax"), c + ".absmax");
  Tensor out = Tensor::empty({n}, DType::kF32, Device::cpu());
  kernels::optim8_dequantize(fx(c + ".q"), fx(c + ".absmax"), signed_map, out);
  expect_bits(out, fx(c + ".dequant"), c + ".dequant");
}

INSTANTIATE_TEST_SUITE_P(Cases, Optim8bitQuant, ::testing::Values("s4128", "s19", "u4128", "u300"),
                         [](const auto& info) { return info.param; });

class Optim8bitSteps : public ::testing::TestWithParam<std::string> {};

TEST_P(Optim8bitSteps, ThreeStepsMatchBitsandbytes) {
  const std::string c = GetParam();
  const bool eight = c == "step8";
  Tensor p = fx(c + ".p0").clone();
  AdamW8bit opt({{"w", p, true}}, AdamWConfig{1e-3, 0.9, 0.999, 1e-8, 0.01});
  for (int t = 1; t <= 3; ++t) {
    p.set_grad(fx(c + ".g" + std::to_string(t)));
    opt.step(1e-3);
    const std::string s = "_" + std::to_string(t);
    expect_bits(p, fx(c + ".p" + std::to_string(t)), c + " param after step " + s);
    auto st = opt.state_tensors();
    ASSERT_EQ(st.size(), eight ? 4u : 2u);
    expect_bits(st[0].second, fx(c + ".state1" + s), c + ".state1" + s);
    expect_bits(st[1].second, fx(c + ".state2" + s), c + ".state2" + s);
    if (eight) {
      expect_bits(st[2].second, fx(c + ".absmax1" + s), c + ".absmax1" + s);
      expect_bits(st[3].second, fx(c + ".absmax2" + s), c + ".absmax2" + s);
    }
  }
  // 2 codes per element and 2 absmax per 256 elements, or two f32 moments.
  const int64_t n = p.numel();
  EXPECT_EQ(opt.state_bytes(), eight ? 2 * n + 2 * 4 * ((n + 255) / 256) : 8 * n);
}

INSTANTIATE_TEST_SUITE_P(Sizes, Optim8bitSteps, ::testing::Values("step8", "step32"),
                         [](const auto& info) { return info.param; });

TEST(Optim8bit, ThirtyTwoBitModeIsBitsandbytesF32Update) {
  // paged_adamw_32bit: every parameter takes bnb's 32-bit update (here the fixture's parameter,
  // below min_8bit_size, so bnb took it too); paged states live on the host.
  Tensor p = fx("step32.p0").clone();
  AdamW8bit opt({{"w", p, true}}, AdamWConfig{1e-3, 0.9, 0.999, 1e-8, 0.01},
                kernels::AdamW8bitOptions{false, true});
  for (int t = 1; t <= 3; ++t) {
    p.set_grad(fx("step32.g" + std::to_string(t)));
    opt.step(1e-3);
  }
  expect_bits(p, fx("step32.p3"), "step32 param after 3 steps");
  EXPECT_EQ(opt.state_tensors()[0].second.device(), Device::cpu());
  // A large parameter stays 32-bit in this mode: 8 bytes per element.
  Tensor big = testing::randn({4128}, DType::kF32, 3);
  AdamW8bit opt32({{"w", big, true}}, AdamWConfig{}, kernels::AdamW8bitOptions{false, true});
  big.set_grad(testing::randn({4128}, DType::kF32, 4));
  opt32.step(1e-3);
  EXPECT_EQ(opt32.state_bytes(), 8 * 4128);
}

TEST(Optim8bit, RestartFromSavedStateContinuesBitForBit) {
  const std::string c = "step8";
  Tensor p = fx(c + ".p0").clone();
  AdamW8bit first({{"w", p, true}}, AdamWConfig{1e-3, 0.9, 0.999, 1e-8, 0.01});
  p.set_grad(fx(c + ".g1"));
  first.step(1e-3);
  std::vector<std::pair<std::string, Tensor>> saved;
  for (const auto& [k, t] : first.state_tensors()) saved.emplace_back(k, t.clone());
  Tensor p2 = p.clone();
  AdamW8bit second({{"w", p2, true}}, AdamWConfig{1e-3, 0.9, 0.999, 1e-8, 0.01});
  second.load_state_tensors(saved);
  second.set_step_count(first.step_count());
  for (int t = 2; t <= 3; ++t) {
    p2.set_grad(fx(c + ".g" + std::to_string(t)));
    second.step(1e-3);
  }
  expect_bits(p2, fx(c + ".p3"), "resumed param");
  // A checkpoint of another shape is refused by name.
  std::vector<std::pair<std::string, Tensor>> bad = saved;
  bad[2].second = Tensor::zeros({3}, DType::kF32, Device::cpu());
  AdamW8bit third({{"w", p.clone(), true}}, AdamWConfig{});
  try {
    third.load_state_tensors(bad);
    ADD_FAILURE() << "mis-shaped state accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w.absmax1"), std::string::npos) << e.what();
  }
}

TEST(Optim8bit, StatesAreTaggedOptimizerAndBf16HasNoMaster) {
  const int64_t n = 71 * 229;  // awkward: 63 full blocks + one of 131
  Tensor p = testing::randn({71, 229}, DType::kBF16, 7);
  Allocator& a = allocator(Device::cpu());
  const int64_t before = a.stats().tag(MemTag::kOptimizer).current;
  AdamW8bit opt({{"w", p, true}}, AdamWConfig{1e-2, 0.9, 0.999, 1e-8, 0.0});
  const std::vector<float> p0 = p.to_f32();
  p.set_grad(testing::randn({71, 229}, DType::kBF16, 8));
  opt.step(1e-2);
  const int64_t blocks = (n + 255) / 256;
  EXPECT_EQ(opt.state_bytes(), 2 * n + 8 * blocks);
  EXPECT_GE(a.stats().tag(MemTag::kOptimizer).current - before, 2 * n + 8 * blocks);
  EXPECT_LT(a.stats().tag(MemTag::kOptimizer).current - before, 2 * n + 8 * blocks + 4 * 512);
  // The first Adam step moves every element by about lr (sign of the gradient).
  const std::vector<float> p1 = p.to_f32();
  int moved = 0;
  for (int64_t i = 0; i < n; ++i) moved += p1[i] != p0[i];
  EXPECT_GT(moved, n / 2);
}

// The paged variants' staging pipeline (optim_8bit_paged.cpp) run on the host (stage_on_host,
// the CPU twin of the CUDA path): states in pinned host memory, stepped in slabs through two
// staging slots, give the unpaged optimizer's parameters and states to the last bit, whatever
// the slab (whole quantization blocks per slab; a short last block only at the tensor's end).
struct PagedCase {
  std::string name;
  std::vector<int64_t> sizes;
  DType dtype;
  bool eight_bit;
  int64_t slab;
};

class Optim8bitPaged : public ::testing::TestWithParam<PagedCase> {};

TEST_P(Optim8bitPaged, SlabsThroughTwoSlotsEqualTheUnpagedStep) {
  const PagedCase& c = GetParam();
  std::vector<Optimizer::Param> a, b;
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    Tensor p = testing::randn({c.sizes[i]}, c.dtype, 30 + i, Device::cpu(), 0.1);
    a.push_back({"p" + std::to_string(i), p, i % 2 == 0});
    b.push_back({"p" + std::to_string(i), p.clone(), i % 2 == 0});
  }
  const AdamWConfig cfg{1e-3, 0.9, 0.999, 1e-8, 0.05};
  AdamW8bit plain(a, cfg, kernels::AdamW8bitOptions{c.eight_bit, false});
  AdamW8bit paged(b, cfg, kernels::AdamW8bitOptions{c.eight_bit, true, c.slab, true});
  Allocator& pinned = pinned_allocator();
  const int64_t pinned_before = pinned.stats().tag(MemTag::kOptimizer).current;
  for (int s = 1; s <= 3; ++s) {
    for (size_t i = 0; i < a.size(); ++i) {
      const Tensor g = testing::randn({c.sizes[i]}, c.dtype, 100 * s + i, Device::cpu(), 0.01);
      a[i].tensor.set_grad(g);
      b[i].tensor.set_grad(g.clone());
    }
    plain.step(1e-3 * s);
    paged.step(1e-3 * s);
    for (size_t i = 0; i < a.size(); ++i)
      expect_bits(b[i].tensor, a[i].tensor, a[i].name + ", step " + std::to_string(s));
  }
  const auto sa = plain.state_tensors(), sb = paged.state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t k = 0; k < sa.size(); ++k) {
    EXPECT_TRUE(sb[k].second.storage()->is_pinned()) << sb[k].first;
    expect_bits(sb[k].second, sa[k].second, sb[k].first);
  }
  // The states are in the pinned pool (blocks rounded up to 512 bytes).
  const int64_t held = pinned.stats().tag(MemTag::kOptimizer).current - pinned_before;
  EXPECT_GE(held, paged.state_bytes());
  EXPECT_LT(held, paged.state_bytes() + 4 * 512 * static_cast<int64_t>(c.sizes.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Slabs, Optim8bitPaged,
    ::testing::Values(
        // 71x229: 63 full blocks + one of 131, cut in slabs of 2 and 1 blocks.
        PagedCase{"bf16_8bit_slab512", {71 * 229, 19, 4097}, DType::kBF16, true, 512},
        PagedCase{"f32_8bit_slab256", {71 * 229, 4096}, DType::kF32, true, 256},
        PagedCase{"bf16_8bit_one_slab", {71 * 229}, DType::kBF16, true, 1 << 20},
        PagedCase{"f32_32bit_slab768", {71 * 229, 1, 19}, DType::kF32, false, 768}),
    [](const auto& info) { return info.param.name; });

// Stochastic rounding to bf16 (bf16 parameters of the 8-bit optimizer): the two neighbours of
// x are drawn with probabilities that make the mean x (here 2^16 draws: within 4 standard
// deviations), signs and exact values are kept, NaN/Inf pass through, and the bits depend only
// on (seed, step, element).
TEST(Optim8bit, StochasticRoundingToBf16IsUnbiased) {
  for (float x : {1.0f + 0.3f / 128.0f, -0.1234567f, 3.0e-20f, 7.77e5f}) {
    const uint32_t u = f32_bits(x);
    const float lo = bf16_to_f32(static_cast<uint16_t>(u >> 16));
    const float hi = bf16_to_f32(static_cast<uint16_t>((u >> 16) + 1));
    const int n = 1 << 16;
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      const float r =
          bf16_to_f32(kernels::bf16_stochastic_from_bits32(u, kernels::optim_random_bits(7, 3, i)));
      ASSERT_TRUE(r == lo || r == hi) << x << " -> " << r;
      sum += r;
    }
    const double p = (static_cast<double>(x) - lo) / (static_cast<double>(hi) - lo);
    const double sd = std::abs(static_cast<double>(hi) - lo) * std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(sum / n, x, 4 * sd + 1e-30) << x;
  }
  EXPECT_EQ(kernels::bf16_stochastic_from_bits32(f32_bits(1.5f), 0xffff), f32_to_bf16(1.5f));
  EXPECT_EQ(kernels::bf16_stochastic_from_bits32(0x7f800000u, 0xffff), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(kernels::bf16_stochastic_from_bits32(0x7fc00001u, 1))));
  EXPECT_EQ(kernels::optim_random_bits(1, 2, 3), kernels::optim_random_bits(1, 2, 3));
  EXPECT_NE(kernels::optim_random_bits(1, 2, 3), kernels::optim_random_bits(1, 3, 3));
}

// A bf16 parameter updated by less than half an ulp per step: rounding to nearest never moves
// it, stochastic rounding moves it by the accumulated update on average.
TEST(Optim8bit, StochasticRoundingKeepsUpdatesBelowHalfAnUlp) {
  const int64_t n = 8192;
  Tensor a = Tensor::full({n}, 1.0, DType::kBF16, Device::cpu());
  Tensor b = a.clone();
  const AdamWConfig cfg{1e-3, 0.9, 0.999, 1e-8, 0.0};  // ulp of bf16 at 1 is 2^-7 = 7.8e-3
  AdamW8bit rn({{"w", a, true}}, cfg,
               kernels::AdamW8bitOptions{true, false, kernels::kPagedSlabElements, false, false});
  AdamW8bit sr({{"w", b, true}}, cfg);
  for (int s = 0; s < 20; ++s) {
    const Tensor g = Tensor::full({n}, 1.0, DType::kBF16, Device::cpu());
    a.set_grad(g);
    b.set_grad(g.clone());
    rn.step(1e-3);
    sr.step(1e-3);
  }
  double mean_a = 0, mean_b = 0;
  for (float v : a.to_f32()) mean_a += v / n;
  for (float v : b.to_f32()) mean_b += v / n;
  EXPECT_EQ(mean_a, 1.0);                 // every update rounded away
  EXPECT_NEAR(mean_b, 1.0 - 0.02, 1e-3);  // 20 steps of about -lr
}

}  // namespace
}  // namespace leantune
