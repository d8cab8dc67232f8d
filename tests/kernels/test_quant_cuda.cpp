// GPU tier for quantized weights (kernels/quant.cu): dequantization on the device equals the
// host path bit for bit (NF4 plain and nested, int8; f32/bf16/f16/f64 outputs; awkward sizes;
// misaligned outputs that take the element-wise path), bitsandbytes' fixture states dequantize
// on the device to bitsandbytes' values, the linear products match the host within GEMM
// rounding, quantizing a device weight equals quantizing it on the host, and the device scratch
// holds one weight.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "kernels/quant.h"
#include "loaders/safetensors.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using kernels::Int8Weight;
using kernels::Nf4Weight;
using testing::all_close;
using testing::Guarded;
using testing::randn;
using testing::Tol;

const Device kGpu = Device::cuda(0);

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  std::vector<uint8_t> v(c.nbytes());
  if (!v.empty()) std::memcpy(v.data(), c.data_ptr(), v.size());
  return v;
}

// Both sides sum the same rounded inputs in f32 in different orders.
Tol gpu_tol(DType dt, int64_t k) {
  const double kk = static_cast<double>(std::max<int64_t>(k, 1));
  switch (dt) {
    case DType::kF64:
      return {1e-12 * kk, 1e-10};
    case DType::kF32:
      return {2e-6 * kk, 1e-4};
    case DType::kF16:
      return {2e-3 * std::sqrt(kk), 5e-3};
    default:
      return {1e-2 * std::sqrt(kk), 1e-2};
  }
}

struct DeqCase {
  int64_t out, in;
  DType dt;
};
std::string deq_name(const ::testing::TestParamInfo<DeqCase>& i) {
  return std::to_string(i.param.out) + "x" + std::to_string(i.param.in) + "_" +
         dtype_name(i.param.dt);
}

class QuantDequantCuda : public ::testing::TestWithParam<DeqCase> {};

TEST_P(QuantDequantCuda, Nf4EqualsHostBitForBit) {
  LT_SKIP_WITHOUT_CUDA();
  const DeqCase c = GetParam();
  const Tensor w = randn({c.out, c.in}, DType::kF32, 101, Device::cpu(), 0.2);
  for (bool dq : {false, true}) {
    SCOPED_TRACE(dq ? "nested" : "plain");
    const Nf4Weight h = kernels::nf4_quantize(w, dq);
    const Nf4Weight g = h.to(kGpu);
    EXPECT_EQ(bytes_of(kernels::nf4_block_absmax(g)), bytes_of(kernels::nf4_block_absmax(h)));
    const Tensor ref = kernels::nf4_dequantize(h, c.dt);
    Guarded out({c.out * c.in}, c.dt, kGpu);
    kernels::nf4_dequantize(g, out.payload());
    EXPECT_TRUE(out.check());
    EXPECT_EQ(bytes_of(out.payload()), bytes_of(ref));
    // One element off 16-byte alignment: the element-wise path.
    Tensor buf = Tensor::empty({c.out * c.in + 1}, c.dt, kGpu);
    Tensor shifted = buf.narrow(0, 1, c.out * c.in);
    kernels::nf4_dequantize(g, shifted);
    EXPECT_EQ(bytes_of(shifted), bytes_of(ref));
  }
}

TEST_P(QuantDequantCuda, Int8EqualsHostBitForBit) {
  LT_SKIP_WITHOUT_CUDA();
  const DeqCase c = GetParam();
  const Int8Weight h = kernels::int8_quantize(randn({c.out, c.in}, DType::kF32, 102));
  const Int8Weight g = h.to(kGpu);
  const Tensor ref = kernels::int8_dequantize(h, c.dt);
  Guarded out({c.out * c.in}, c.dt, kGpu);
  kernels::int8_dequantize(g, out.payload());
  EXPECT_TRUE(out.check());
  EXPECT_EQ(bytes_of(out.payload()), bytes_of(ref));
  Tensor buf = Tensor::empty({c.out * c.in + 1}, c.dt, kGpu);
  Tensor shifted = buf.narrow(0, 1, c.out * c.in);
  kernels::int8_dequantize(g, shifted);
  EXPECT_EQ(bytes_of(shifted), bytes_of(ref));
}

INSTANTIATE_TEST_SUITE_P(Awkward, QuantDequantCuda,
                         ::testing::Values(DeqCase{1, 1, DType::kF32}, DeqCase{1, 19, DType::kBF16},
                                           DeqCase{3, 64, DType::kF16},
                                           DeqCase{71, 229, DType::kBF16},
                                           DeqCase{97, 201, DType::kF32},
                                           DeqCase{33, 15, DType::kF64},
                                           DeqCase{300, 257, DType::kBF16}),
                         deq_name);

// bitsandbytes' own nested states (tests/fixtures/quant/nf4.safetensors) on the device.
TEST(QuantFixtureCuda, BitsandbytesNestedStatesDequantizeExactly) {
  LT_SKIP_WITHOUT_CUDA();
  auto f = SafetensorsFile::open(testing::fixture_path("quant/nf4.safetensors"));
  for (const std::string name :
       {"case21", "r1x19", "r7x100_bf16", "r97x201_wide_bf16", "zeros_3x70", "ties_1x64"}) {
    SCOPED_TRACE(name);
    const Tensor w = f->tensor(name + ".weight");
    Nf4Weight q;
    q.shape = w.shape();
    q.packed = f->tensor(name + ".packed").to(kGpu);
    q.qabsmax = f->tensor(name + ".nested.qabsmax").to(kGpu);
    q.absmax2 = f->tensor(name + ".nested.absmax2").to(kGpu);
    q.offset = f->tensor(name + ".nested.offset").to_f32()[0];
    EXPECT_EQ(bytes_of(kernels::nf4_dequantize(q, w.dtype())),
              bytes_of(f->tensor(name + ".nested.dequant")));
  }
}

TEST(QuantFixtureCuda, QuantizingADeviceWeightEqualsHost) {
  LT_SKIP_WITHOUT_CUDA();
  const Tensor w = randn({37, 129}, DType::kBF16, 103);
  const Nf4Weight h = kernels::nf4_quantize(w, true);
  const Nf4Weight g = kernels::nf4_quantize(w.to(kGpu), true);
  EXPECT_EQ(g.device(), kGpu);
  EXPECT_EQ(g.packed.tag(), MemTag::kParam);
  EXPECT_EQ(bytes_of(g.packed), bytes_of(h.packed));
  EXPECT_EQ(bytes_of(g.qabsmax), bytes_of(h.qabsmax));
  EXPECT_EQ(bytes_of(g.absmax2), bytes_of(h.absmax2));
  EXPECT_EQ(g.offset, h.offset);
  const Int8Weight i = kernels::int8_quantize(w.to(kGpu));
  EXPECT_EQ(bytes_of(i.q), bytes_of(kernels::int8_quantize(w).q));
}

struct LinCase {
  std::string fmt;
  DType dt;
  int64_t t, in, out;
  bool bias;
};
std::string lin_name(const ::testing::TestParamInfo<LinCase>& i) {
  const LinCase& c = i.param;
  return c.fmt + "_" + dtype_name(c.dt) + "_T" + std::to_string(c.t) + "_in" +
         std::to_string(c.in) + "_out" + std::to_string(c.out) + (c.bias ? "_bias" : "");
}

class QuantLinearCuda : public ::testing::TestWithParam<LinCase> {};

TEST_P(QuantLinearCuda, ForwardAndBackwardMatchHost) {
  LT_SKIP_WITHOUT_CUDA();
  const LinCase c = GetParam();
  const Tensor wd = randn({c.out, c.in}, DType::kF32, 111, Device::cpu(), 0.1);
  const Tensor x = randn({c.t, c.in}, c.dt, 112), dy = randn({c.t, c.out}, c.dt, 113);
  const Tensor b = c.bias ? randn({c.out}, c.dt, 114) : Tensor();
  Tensor y = Tensor::empty({c.t, c.out}, c.dt), dx = Tensor::empty({c.t, c.in}, c.dt);
  Tensor db = c.bias ? Tensor::empty({c.out}, c.dt) : Tensor();
  Guarded yg({c.t, c.out}, c.dt, kGpu), dxg({c.t, c.in}, c.dt, kGpu), dbg({c.out}, c.dt, kGpu);
  const Tensor xg = x.to(kGpu), dyg = dy.to(kGpu), bg = c.bias ? b.to(kGpu) : Tensor();
  if (c.fmt == "int8") {
    const Int8Weight h = kernels::int8_quantize(wd), g = h.to(kGpu);
    kernels::int8_linear_fwd(x, h, b, y);
    kernels::int8_linear_bwd(dy, h, dx, db);
    kernels::int8_linear_fwd(xg, g, bg, yg.payload());
    kernels::int8_linear_bwd(dyg, g, dxg.payload(), c.bias ? dbg.payload() : Tensor());
  } else {
    const Nf4Weight h = kernels::nf4_quantize(wd, c.fmt == "nf4dq"), g = h.to(kGpu);
    kernels::nf4_linear_fwd(x, h, b, y);
    kernels::nf4_linear_bwd(dy, h, dx, db);
    kernels::nf4_linear_fwd(xg, g, bg, yg.payload());
    kernels::nf4_linear_bwd(dyg, g, dxg.payload(), c.bias ? dbg.payload() : Tensor());
  }
  EXPECT_TRUE(yg.check());
  EXPECT_TRUE(dxg.check());
  EXPECT_TRUE(dbg.check());
  EXPECT_TRUE(all_close(yg.payload().to(Device::cpu()), y, gpu_tol(c.dt, c.in)));
  EXPECT_TRUE(all_close(dxg.payload().to(Device::cpu()), dx, gpu_tol(c.dt, c.out)));
  if (c.bias) {
    EXPECT_TRUE(all_close(dbg.payload().to(Device::cpu()), db, gpu_tol(c.dt, c.t)));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantLinearCuda,
                         ::testing::Values(LinCase{"nf4", DType::kF32, 1, 19, 7, false},
                                           LinCase{"nf4dq", DType::kBF16, 33, 229, 71, true},
                                           LinCase{"nf4dq", DType::kF16, 5, 64, 3, true},
                                           LinCase{"nf4", DType::kF64, 4, 33, 5, true},
                                           LinCase{"int8", DType::kBF16, 17, 229, 71, true},
                                           LinCase{"int8", DType::kF32, 1, 19, 7, false}),
                         lin_name);

TEST(QuantWorkspaceCuda, OneScratchOfTheLargestWeight) {
  LT_SKIP_WITHOUT_CUDA();
  kernels::release_quant_workspace(kGpu);
  const Nf4Weight a = kernels::nf4_quantize(randn({96, 200}, DType::kF32, 121), true).to(kGpu);
  const Nf4Weight b = kernels::nf4_quantize(randn({200, 64}, DType::kF32, 122), true).to(kGpu);
  Tensor x = randn({4, 200}, DType::kBF16, 123, kGpu),
         y = Tensor::empty({4, 96}, DType::kBF16, kGpu);
  Tensor x2 = randn({4, 64}, DType::kBF16, 124, kGpu),
         y2 = Tensor::empty({4, 200}, DType::kBF16, kGpu);
  kernels::nf4_linear_fwd(x, a, Tensor(), y);
  kernels::nf4_linear_fwd(x2, b, Tensor(), y2);
  EXPECT_EQ(kernels::quant_workspace_bytes(kGpu), 96 * 200 * 2);
  kernels::nf4_linear_bwd(y, a, Tensor::empty({4, 200}, DType::kBF16, kGpu), Tensor());
  EXPECT_EQ(kernels::quant_workspace_bytes(kGpu), 96 * 200 * 2);
  device_synchronize(kGpu);
  kernels::release_quant_workspace(kGpu);
  EXPECT_EQ(kernels::quant_workspace_bytes(kGpu), 0);
}

}  // namespace
}  // namespace leantune
