// NF4 and int8 weight quantization (kernels/quant.h) on the host, against values computed by
// bitsandbytes 0.50.2 (tests/fixtures/gen_quant_fixtures.py -> tests/fixtures/quant/*.safetensors):
// packed bytes, absmax, double-quant state and the 8-bit dynamic codes bit for bit, dequantized
// values bit for bit (same f32 operations). Plus acceptance case 21, the round-trip error bound
// on awkward sizes, the linear products against float64 references over the dequantized weight,
// the reuse of the dequantization scratch, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/ops.h"
#include "engine/stream.h"
#include "kernel_test_util.h"
#include "kernels/linear.h"
#include "kernels/quant.h"
#include "loaders/safetensors.h"

namespace leantune {
namespace {

using kernel_test::near_ref;
using kernel_test::scaled_tol;
using kernel_test::Vec;
using kernels::Int8Weight;
using kernels::Nf4Weight;
using testing::bytes_of;
using testing::Guarded;
using testing::randn;

std::shared_ptr<SafetensorsFile> fixture(const std::string& name) {
  static std::map<std::string, std::shared_ptr<SafetensorsFile>> cache;
  auto& f = cache[name];
  if (!f) f = SafetensorsFile::open(testing::fixture_path("quant/" + name));
  return f;
}

// Bitwise equality of two tensors' contents (same dtype and element count).
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& e) {
  if (a.dtype() != e.dtype() || a.numel() != e.numel())
    return ::testing::AssertionFailure() << a.str() << " vs " << e.str();
  const std::vector<uint8_t> x = bytes_of(a), y = bytes_of(e);
  const size_t es = a.element_size();
  for (size_t i = 0; i < x.size(); i += es)
    if (std::memcmp(&x[i], &y[i], es) != 0) {
      const int64_t k = static_cast<int64_t>(i / es);
      return ::testing::AssertionFailure()
             << "element " << k << " of " << a.numel() << " differs: " << a.flatten().to_f64()[k]
             << " vs expected " << e.flatten().to_f64()[k];
    }
  return ::testing::AssertionSuccess();
}

int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

// ---------------------------------------------------------------- tables and case 21

TEST(Nf4, TablesEqualBitsandbytes) {
  auto f = fixture("nf4.safetensors");
  EXPECT_TRUE(same_bits(
      Tensor::from_vector(std::vector<float>(kernels::kNf4Code, kernels::kNf4Code + 16), {16}),
      f->tensor("nf4_code")));
  EXPECT_TRUE(
      same_bits(Tensor::from_vector(
                    std::vector<float>(kernels::kDynamicMap, kernels::kDynamicMap + 256), {256}),
                f->tensor("dynamic_map")));
  EXPECT_EQ(kernels::kNf4Code[7], 0.0f);
  EXPECT_EQ(kernels::kDynamicMap[0], -0.99296875f);
  EXPECT_EQ(kernels::kDynamicMap[127], 0.0f);
  EXPECT_EQ(kernels::kDynamicMap[255], 1.0f);
}

// Acceptance case 21: [0.2, -0.4, 0.8, 0.0] -> absmax 0.8, codes [10, 2, 15, 7], bytes
// [0xA2, 0xF7], dequantized [0.196890, -0.420058, 0.8, 0].
TEST(Nf4, AcceptanceCase21) {
  Tensor w = Tensor::from_vector(std::vector<float>{0.2f, -0.4f, 0.8f, 0.0f}, {1, 4});
  Nf4Weight q = kernels::nf4_quantize(w, /*double_quant=*/false);
  EXPECT_EQ(bytes_of(q.packed), (std::vector<uint8_t>{0xA2, 0xF7}));
  ASSERT_EQ(q.absmax.numel(), 1);
  EXPECT_EQ(q.absmax.to_f32()[0], 0.8f);
  Vec d = kernels::nf4_dequantize(q, DType::kF32).to_f64();
  EXPECT_NEAR(d[0], 0.196890, 1e-6);
  EXPECT_NEAR(d[1], -0.420058, 1e-6);
  EXPECT_EQ(d[2], static_cast<double>(0.8f));
  EXPECT_EQ(d[3], 0.0);
  EXPECT_EQ(q.storage_bytes(), 2 + 4);
}

// ---------------------------------------------------------------- NF4 against bitsandbytes

class Nf4Bnb : public ::testing::TestWithParam<std::string> {
 protected:
  Tensor t(const std::string& part) const {
    return fixture("nf4.safetensors")->tensor(GetParam() + "." + part);
  }
};

TEST_P(Nf4Bnb, PackedBytesAndAbsmaxBitExact) {
  const Tensor w = t("weight");
  Nf4Weight q = kernels::nf4_quantize(w, false);
  EXPECT_EQ(q.shape, w.shape());
  EXPECT_FALSE(q.nested());
  EXPECT_EQ(bytes_of(q.packed), bytes_of(t("packed")));
  EXPECT_TRUE(same_bits(q.absmax, t("absmax")));
  EXPECT_EQ(q.storage_bytes(), (w.numel() + 1) / 2 + 4 * q.num_blocks());
}

TEST_P(Nf4Bnb, DequantizedBitExact) {
  const Tensor w = t("weight");
  Nf4Weight q = kernels::nf4_quantize(w, false);
  const Tensor expected = t("dequant");  // in the weight's dtype, as bnb returns it
  Tensor d = kernels::nf4_dequantize(q, w.dtype());
  EXPECT_EQ(d.shape(), w.shape());
  EXPECT_TRUE(same_bits(d, expected));
  // The f32 values are the products themselves; f64 widens them exactly; bf16/f16 round once.
  const Tensor f32 = kernels::nf4_dequantize(q, DType::kF32);
  EXPECT_TRUE(same_bits(kernels::nf4_dequantize(q, DType::kF64), f32.to(DType::kF64)));
  EXPECT_TRUE(same_bits(kernels::nf4_dequantize(q, DType::kBF16), f32.to(DType::kBF16)));
  EXPECT_TRUE(same_bits(kernels::nf4_dequantize(q, DType::kF16), f32.to(DType::kF16)));
}

// bitsandbytes' own nested state (its offset included) dequantizes to its values bit for bit,
// and its absmax - offset re-quantizes to its codes.
TEST_P(Nf4Bnb, NestedStateFromBitsandbytesBitExact) {
  const Tensor w = t("weight");
  Nf4Weight q;
  q.shape = w.shape();
  q.packed = t("packed").clone(MemTag::kOther);
  q.qabsmax = t("nested.qabsmax").clone(MemTag::kOther);
  q.absmax2 = t("nested.absmax2").clone(MemTag::kOther);
  q.offset = t("nested.offset").to_f32()[0];
  kernels::check_nf4(q, "test");
  EXPECT_TRUE(same_bits(kernels::nf4_dequantize(q, w.dtype()), t("nested.dequant")));

  const Tensor absmax = t("absmax");
  const int64_t blocks = absmax.numel();
  Tensor centered = Tensor::empty({blocks}, DType::kF32);
  for (int64_t b = 0; b < blocks; ++b)
    centered.data<float>()[b] = absmax.data<float>()[b] - q.offset;
  Tensor codes = Tensor::empty({blocks}, DType::kU8);
  Tensor absmax2 = Tensor::empty({(blocks + 255) / 256}, DType::kF32);
  kernels::dynamic8_quantize(centered, 256, codes, absmax2);
  EXPECT_EQ(bytes_of(codes), bytes_of(t("nested.qabsmax")));
  EXPECT_TRUE(same_bits(absmax2, t("nested.absmax2")));
}

// Our own double quantization: the offset is the f64 mean (torch's f32 mean may be one ulp
// off), everything downstream follows from it.
TEST_P(Nf4Bnb, DoubleQuantMatchesBitsandbytes) {
  const Tensor w = t("weight");
  Nf4Weight q = kernels::nf4_quantize(w, true);
  ASSERT_TRUE(q.nested());
  EXPECT_FALSE(q.absmax.defined());
  EXPECT_EQ(bytes_of(q.packed), bytes_of(t("packed")));
  EXPECT_LE(ulps(q.offset, t("nested.offset").to_f32()[0]), 1);
  EXPECT_EQ(bytes_of(q.qabsmax), bytes_of(t("nested.qabsmax")));
  const Vec a2 = q.absmax2.to_f64(), e2 = t("nested.absmax2").to_f64();
  ASSERT_EQ(a2.size(), e2.size());
  for (size_t i = 0; i < a2.size(); ++i) EXPECT_NEAR(a2[i], e2[i], 1e-6 * std::abs(e2[i]) + 1e-38);
  // Dequantized: equal up to the offset's last bit, scaled by at most 1 (|code| <= 1).
  const double ulp = std::ldexp(1.0, -23);
  const double tol = 4.0 * ulp * std::abs(static_cast<double>(q.offset));
  const Vec d = kernels::nf4_dequantize(q, DType::kF32).to_f64();
  const Vec e = t("nested.dequant").to(DType::kF32).to_f64();
  ASSERT_EQ(d.size(), e.size());
  const double slack = w.dtype() == DType::kF32 ? 0.0 : std::ldexp(1.0, -7);  // one bf16 ulp
  for (size_t i = 0; i < d.size(); ++i)
    ASSERT_LE(std::abs(d[i] - e[i]), tol + (2.0 * ulp + slack) * std::abs(e[i])) << "element " << i;
  EXPECT_EQ(q.storage_bytes(),
            (w.numel() + 1) / 2 + q.num_blocks() + 4 * ((q.num_blocks() + 255) / 256) + 4);
}

INSTANTIATE_TEST_SUITE_P(Fixture, Nf4Bnb,
                         ::testing::Values("case21", "r1x1", "r1x19", "r3x64", "r7x100_bf16",
                                           "r71x229_bf16", "r97x201_wide_bf16", "zeros_3x70",
                                           "ties_1x64"),
                         [](const auto& i) { return i.param; });

// ---------------------------------------------------------------- 8-bit dynamic blockwise

class Dynamic8Bnb : public ::testing::TestWithParam<std::string> {};

TEST_P(Dynamic8Bnb, CodesAbsmaxAndDequantBitExact) {
  auto f = fixture("dynamic8.safetensors");
  const Tensor x = f->tensor(GetParam() + ".x");
  const int64_t n = x.numel(), blocks = (n + 255) / 256;
  Tensor q = Tensor::empty({n}, DType::kU8), am = Tensor::empty({blocks}, DType::kF32);
  kernels::dynamic8_quantize(x, 256, q, am);
  EXPECT_EQ(bytes_of(q), bytes_of(f->tensor(GetParam() + ".q")));
  EXPECT_TRUE(same_bits(am, f->tensor(GetParam() + ".absmax")));
  Tensor d = Tensor::empty({n}, DType::kF32);
  kernels::dynamic8_dequantize(q, am, 256, d);
  EXPECT_TRUE(same_bits(d, f->tensor(GetParam() + ".dequant")));
}

INSTANTIATE_TEST_SUITE_P(Fixture, Dynamic8Bnb,
                         ::testing::Values("ties", "zeros_then_tiny", "randn_600", "all_zero_256"),
                         [](const auto& i) { return i.param; });

// ---------------------------------------------------------------- int8 against bitsandbytes

class Int8Bnb : public ::testing::TestWithParam<std::string> {};

TEST_P(Int8Bnb, CodesScalesAndDequantBitExact) {
  auto f = fixture("int8.safetensors");
  const Tensor w = f->tensor(GetParam() + ".weight");
  Int8Weight q = kernels::int8_quantize(w);
  EXPECT_EQ(bytes_of(q.q), bytes_of(f->tensor(GetParam() + ".cb")));
  EXPECT_TRUE(same_bits(q.absmax, f->tensor(GetParam() + ".scb")));
  EXPECT_TRUE(
      same_bits(kernels::int8_dequantize(q, DType::kF32), f->tensor(GetParam() + ".dequant")));
  EXPECT_EQ(q.storage_bytes(), w.numel() + 4 * w.size(0));
}

INSTANTIATE_TEST_SUITE_P(Fixture, Int8Bnb,
                         ::testing::Values("r1x19", "r5x64", "r71x229_bf16", "r9x33_bf16",
                                           "zero_row_4x10", "ties_2x8"),
                         [](const auto& i) { return i.param; });

// ---------------------------------------------------------------- properties on awkward sizes

struct SizeCase {
  int64_t out, in;
  DType dt;
};
std::string size_name(const ::testing::TestParamInfo<SizeCase>& i) {
  return std::to_string(i.param.out) + "x" + std::to_string(i.param.in) + "_" +
         dtype_name(i.param.dt);
}

class QuantSizes : public ::testing::TestWithParam<SizeCase> {};

// Every element lands on the code nearest to w / absmax: the error is at most half the widest
// gap between neighbouring codes, times the block's absmax.
TEST_P(QuantSizes, Nf4RoundTripWithinHalfCodeGap) {
  const SizeCase c = GetParam();
  const Tensor w = randn({c.out, c.in}, c.dt, 11, Device::cpu(), 0.05);
  for (bool dq : {false, true}) {
    Nf4Weight q = kernels::nf4_quantize(w, dq);
    const Vec wv = w.to_f64(), d = kernels::nf4_dequantize(q, DType::kF64).to_f64();
    const Vec am = kernels::nf4_block_absmax(q).to_f64();
    double gap = 0;
    for (int i = 0; i < 15; ++i)
      gap = std::max(gap, double(kernels::kNf4Code[i + 1]) - kernels::kNf4Code[i]);
    for (size_t i = 0; i < wv.size(); ++i) {
      const double a = am[i / 64];
      // Double quantization perturbs the block scale by up to half a dynamic-map step.
      const double scale_err = dq ? std::abs(a) * 0.02 + 1e-7 : 0.0;
      ASSERT_LE(std::abs(d[i] - wv[i]), gap / 2 * a + scale_err + 1e-7) << "element " << i;
    }
  }
}

TEST_P(QuantSizes, Int8RoundTripWithinHalfStep) {
  const SizeCase c = GetParam();
  const Tensor w = randn({c.out, c.in}, c.dt, 12, Device::cpu(), 0.05);
  Int8Weight q = kernels::int8_quantize(w);
  const Vec wv = w.to_f64(), d = kernels::int8_dequantize(q, DType::kF64).to_f64();
  const Vec am = q.absmax.to_f64();
  for (size_t i = 0; i < wv.size(); ++i) {
    const double a = am[i / c.in];
    // Half a step, plus the f16 rounding Int8Params applies first.
    ASSERT_LE(std::abs(d[i] - wv[i]), a / 127 * 0.5 + std::abs(wv[i]) * 1e-3 + 1e-7)
        << "element " << i;
  }
}

// The result depends only on the values: quantizing a strided view gives the same bytes.
TEST_P(QuantSizes, StridedInputSameAsContiguous) {
  const SizeCase c = GetParam();
  const Tensor wt = randn({c.in, c.out}, c.dt, 13);
  const Tensor w = wt.transpose(0, 1);
  Nf4Weight a = kernels::nf4_quantize(w, true), b = kernels::nf4_quantize(w.contiguous(), true);
  EXPECT_EQ(bytes_of(a.packed), bytes_of(b.packed));
  EXPECT_EQ(bytes_of(a.qabsmax), bytes_of(b.qabsmax));
  EXPECT_EQ(a.offset, b.offset);
  Int8Weight i = kernels::int8_quantize(w), j = kernels::int8_quantize(w.contiguous());
  EXPECT_EQ(bytes_of(i.q), bytes_of(j.q));
}

INSTANTIATE_TEST_SUITE_P(
    Awkward, QuantSizes,
    ::testing::Values(SizeCase{1, 1, DType::kF32}, SizeCase{1, 19, DType::kF32},
                      SizeCase{7, 9, DType::kBF16}, SizeCase{71, 229, DType::kF32},
                      SizeCase{129, 131, DType::kBF16}, SizeCase{33, 63, DType::kF64},
                      SizeCase{5, 128, DType::kF16}),
    size_name);

// ---------------------------------------------------------------- linear products

struct LinCase {
  std::string fmt;  // nf4, nf4dq, int8
  DType dt;
  int64_t t, in, out;
  bool bias;
};
std::string lin_name(const ::testing::TestParamInfo<LinCase>& i) {
  const LinCase& c = i.param;
  return c.fmt + "_" + dtype_name(c.dt) + "_T" + std::to_string(c.t) + "_in" +
         std::to_string(c.in) + "_out" + std::to_string(c.out) + (c.bias ? "_bias" : "");
}

class QuantLinear : public ::testing::TestWithParam<LinCase> {
 protected:
  void SetUp() override {
    const LinCase& c = GetParam();
    w_dense_ = randn({c.out, c.in}, DType::kF32, 21, Device::cpu(), 0.1);
    if (c.fmt == "int8")
      i8_ = kernels::int8_quantize(w_dense_);
    else
      nf4_ = kernels::nf4_quantize(w_dense_, c.fmt == "nf4dq");
  }
  Tensor dequant(DType dt) const {
    return GetParam().fmt == "int8" ? kernels::int8_dequantize(i8_, dt)
                                    : kernels::nf4_dequantize(nf4_, dt);
  }
  void fwd(const Tensor& x, const Tensor& b, const Tensor& y) const {
    if (GetParam().fmt == "int8")
      kernels::int8_linear_fwd(x, i8_, b, y);
    else
      kernels::nf4_linear_fwd(x, nf4_, b, y);
  }
  void bwd(const Tensor& dy, const Tensor& dx, const Tensor& db) const {
    if (GetParam().fmt == "int8")
      kernels::int8_linear_bwd(dy, i8_, dx, db);
    else
      kernels::nf4_linear_bwd(dy, nf4_, dx, db);
  }
  Tensor w_dense_;
  Nf4Weight nf4_;
  Int8Weight i8_;
};

TEST_P(QuantLinear, ForwardMatchesDenseLinearOverDequantizedWeight) {
  const LinCase c = GetParam();
  const Tensor x = randn({c.t, c.in}, c.dt, 22);
  const Tensor b = c.bias ? randn({c.out}, c.dt, 23) : Tensor();
  Guarded y({c.t, c.out}, c.dt, Device::cpu());
  fwd(x, b, y.payload());
  EXPECT_TRUE(y.check());
  // Same dequantized W, same dense kernel: identical results.
  const Tensor wd = dequant(c.dt);
  Tensor ref = Tensor::empty({c.t, c.out}, c.dt);
  kernels::linear_fwd(x, wd, b, ref);
  EXPECT_TRUE(same_bits(y.payload(), ref));
  // And close to the float64 product.
  const Vec xv = x.to_f64(), wv = wd.to_f64(), bv = c.bias ? b.to_f64() : Vec();
  Vec r(static_cast<size_t>(c.t * c.out));
  for (int64_t i = 0; i < c.t; ++i)
    for (int64_t o = 0; o < c.out; ++o) {
      double s = c.bias ? bv[o] : 0.0;
      for (int64_t k = 0; k < c.in; ++k) s += xv[i * c.in + k] * wv[o * c.in + k];
      r[i * c.out + o] = s;
    }
  EXPECT_TRUE(near_ref(y.payload(), r, scaled_tol(c.dt, 0.1 * std::sqrt(double(c.in)))));
}

TEST_P(QuantLinear, BackwardMatchesFloat64Reference) {
  const LinCase c = GetParam();
  const Tensor dy = randn({c.t, c.out}, c.dt, 24);
  Guarded dx({c.t, c.in}, c.dt, Device::cpu()), db({c.out}, c.dt, Device::cpu());
  bwd(dy, dx.payload(), c.bias ? db.payload() : Tensor());
  EXPECT_TRUE(dx.check());
  EXPECT_TRUE(db.check());
  const Vec g = dy.to_f64(), wv = dequant(c.dt).to_f64();
  Vec rdx(static_cast<size_t>(c.t * c.in), 0.0), rdb(static_cast<size_t>(c.out), 0.0);
  for (int64_t i = 0; i < c.t; ++i)
    for (int64_t o = 0; o < c.out; ++o) {
      rdb[o] += g[i * c.out + o];
      for (int64_t k = 0; k < c.in; ++k) rdx[i * c.in + k] += g[i * c.out + o] * wv[o * c.in + k];
    }
  EXPECT_TRUE(near_ref(dx.payload(), rdx, scaled_tol(c.dt, 0.1 * std::sqrt(double(c.out)))));
  if (c.bias) {
    EXPECT_TRUE(near_ref(db.payload(), rdb, scaled_tol(c.dt, std::sqrt(double(c.t)))));
  }
  // db alone (no dx): no dequantization needed.
  if (c.bias) {
    Tensor db2 = Tensor::empty({c.out}, c.dt);
    bwd(dy, Tensor(), db2);
    EXPECT_TRUE(same_bits(db2, db.payload()));
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, QuantLinear,
                         ::testing::Values(LinCase{"nf4", DType::kF32, 1, 19, 7, false},
                                           LinCase{"nf4dq", DType::kF32, 5, 64, 3, true},
                                           LinCase{"nf4dq", DType::kBF16, 3, 229, 71, true},
                                           LinCase{"nf4", DType::kF64, 4, 33, 5, true},
                                           LinCase{"nf4dq", DType::kF16, 2, 128, 9, false},
                                           LinCase{"int8", DType::kF32, 1, 19, 7, true},
                                           LinCase{"int8", DType::kBF16, 3, 229, 71, false},
                                           LinCase{"int8", DType::kF64, 4, 33, 5, true}),
                         lin_name);

// ---------------------------------------------------------------- the dequantization scratch

// One scratch per device, sized by the largest weight seen, reused by every later product.
TEST(QuantWorkspace, GrowsToLargestWeightAndIsReused) {
  const Device cpu = Device::cpu();
  kernels::release_quant_workspace(cpu);
  EXPECT_EQ(kernels::quant_workspace_bytes(cpu), 0);
  const Nf4Weight big = kernels::nf4_quantize(randn({71, 229}, DType::kF32, 31), true);
  const Nf4Weight small = kernels::nf4_quantize(randn({7, 19}, DType::kF32, 32), true);
  const Tensor x = randn({3, 229}, DType::kF32, 33), xs = randn({3, 19}, DType::kF32, 34);
  Tensor y = Tensor::empty({3, 71}, DType::kF32), ys = Tensor::empty({3, 7}, DType::kF32);
  kernels::nf4_linear_fwd(xs, small, Tensor(), ys);
  EXPECT_EQ(kernels::quant_workspace_bytes(cpu), 7 * 19 * 4);
  kernels::nf4_linear_fwd(x, big, Tensor(), y);
  EXPECT_EQ(kernels::quant_workspace_bytes(cpu), 71 * 229 * 4);
  const int64_t ws = allocator(cpu).stats().tag(MemTag::kWorkspace).current;
  kernels::nf4_linear_fwd(xs, small, Tensor(), ys);
  kernels::nf4_linear_bwd(y, big, Tensor::empty({3, 229}, DType::kF32), Tensor());
  EXPECT_EQ(kernels::quant_workspace_bytes(cpu), 71 * 229 * 4);
  EXPECT_EQ(allocator(cpu).stats().tag(MemTag::kWorkspace).current, ws);
  kernels::release_quant_workspace(cpu);
  EXPECT_EQ(kernels::quant_workspace_bytes(cpu), 0);
  EXPECT_LT(allocator(cpu).stats().tag(MemTag::kWorkspace).current, ws);
}

// Work on another stream gets a buffer of its own (reuse is only ordered within a stream).
TEST(QuantWorkspace, OneBufferPerStream) {
  const Device cpu = Device::cpu();
  kernels::release_quant_workspace(cpu);
  const Int8Weight w = kernels::int8_quantize(randn({9, 33}, DType::kF32, 35));
  const Tensor x = randn({2, 33}, DType::kF32, 36);
  Tensor y = Tensor::empty({2, 9}, DType::kF32), y2 = Tensor::empty({2, 9}, DType::kF32);
  kernels::int8_linear_fwd(x, w, Tensor(), y);
  EXPECT_EQ(kernels::quant_workspace_bytes(cpu), 9 * 33 * 4);
  {
    StreamGuard g(new_stream(cpu));
    kernels::int8_linear_fwd(x, w, Tensor(), y2);
  }
  EXPECT_EQ(kernels::quant_workspace_bytes(cpu), 2 * 9 * 33 * 4);
  EXPECT_TRUE(same_bits(y, y2));
  kernels::release_quant_workspace(cpu);
  EXPECT_EQ(kernels::quant_workspace_bytes(cpu), 0);
}

// ---------------------------------------------------------------- errors

TEST(QuantErrors, NonFiniteWeightsAreInputErrors) {
  Tensor w = Tensor::from_vector(std::vector<float>{1.0f, NAN, 0.5f}, {1, 3});
  w.set_name("model.layers.0.mlp.up_proj.weight");
  try {
    kernels::nf4_quantize(w, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("up_proj"), std::string::npos) << e.what();
  }
  Tensor big = Tensor::from_vector(std::vector<float>{1.0f, 70000.0f}, {1, 2});
  try {
    kernels::int8_quantize(big);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("65504"), std::string::npos) << e.what();
  }
}

TEST(QuantErrors, InconsistentPartsAndShapes) {
  Nf4Weight q = kernels::nf4_quantize(randn({4, 64}, DType::kF32, 41), true);
  Nf4Weight bad = q;
  bad.absmax2 = Tensor::zeros({2}, DType::kF32);
  EXPECT_THROW(kernels::check_nf4(bad, "test"), Error);
  bad = q;
  bad.packed = bad.packed.narrow(0, 0, 10);
  EXPECT_THROW(kernels::nf4_dequantize(bad, DType::kF32), Error);
  Tensor y = Tensor::empty({2, 4}, DType::kF32);
  EXPECT_THROW(kernels::nf4_linear_fwd(randn({2, 63}, DType::kF32, 42), q, Tensor(), y), Error);
  Nf4Weight flat = kernels::nf4_quantize(randn({256}, DType::kF32, 43), false);
  EXPECT_THROW(kernels::nf4_linear_fwd(randn({2, 256}, DType::kF32, 44), flat, Tensor(), y), Error);
}

}  // namespace
}  // namespace leantune
