// GPU tier for the raw ops (engine/ops_cuda_*.cu): every op on a CUDA device against the same op
// on host copies of the same inputs (the CPU path is the reference). Fresh random inputs per
// case, odd sizes (1, 19, 71x229) and the Qwen2.5-0.5B widths (896, 4864), strided views, guard
// bands around preallocated outputs; a NaN on one side only fails. Skipped without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine/ops.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::all_close;
using testing::Guarded;
using testing::Tol;

const Device kGpu = Device::cuda(0);

// Tolerances of the CUDA tier: f32 1e-4 relative, bf16/f16 about 1e-2 (one rounding apart).
Tol gpu_tol(DType dt, double scale = 1.0) {
  switch (dt) {
    case DType::kF64:
      return {1e-12 * scale, 1e-10};
    case DType::kF32:
      return {1e-6 * scale, 1e-4};
    case DType::kF16:
      return {1e-3 * scale, 5e-3};
    default:
      return {8e-3 * scale, 1e-2};
  }
}

Tensor host(const Tensor& t) { return t.to(Device::cpu()); }

// Random normal values on the host, the same tensor copied to the device.
struct Pair {
  Tensor h, d;
};
Pair rand_pair(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  Tensor h = testing::randn(s, dt, seed, Device::cpu(), std);
  return {h, h.to(kGpu)};
}
Pair uniform_pair(const Shape& s, DType dt, uint64_t seed, double lo, double hi) {
  Tensor h = testing::randu(s, dt, seed, lo, hi, Device::cpu());
  return {h, h.to(kGpu)};
}

std::string dt_name(const ::testing::TestParamInfo<DType>& p) { return dtype_name(p.param); }

const std::vector<Shape> kShapes = {{1}, {19}, {71, 229}, {3, 896}, {2, 4864}};

class OpsCuda : public ::testing::TestWithParam<DType> {};

TEST_P(OpsCuda, CopyRoundTripIsExact) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  for (const Shape& s : kShapes) {
    Pair p = rand_pair(s, dt, 11);
    Tensor back = host(p.d);
    ASSERT_EQ(back.dtype(), dt);
    EXPECT_EQ(back.to_f64(), p.h.to_f64()) << shape_str(s);
  }
}

TEST_P(OpsCuda, CopyConvertsLikeTheHost) {
  LT_SKIP_WITHOUT_CUDA();
  const DType src = GetParam();
  Pair p = rand_pair({71, 229}, src, 12, 50.0);
  for (DType dst : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32, DType::kI64,
                    DType::kBool}) {
    // Device-side conversion (same device, different dtype) against the host conversion. (A
    // bool buffer cannot hold the guard sentinel, so it goes unguarded.)
    Tensor ref = Tensor::empty({71, 229}, dst);
    ops::copy(ref, p.h);
    if (dst != DType::kBool) {
      Guarded out({71, 229}, dst, kGpu);
      ops::copy(out.payload(), p.d);
      EXPECT_TRUE(out.check()) << dtype_name(dst);
      EXPECT_EQ(out.payload().to_f64(), ref.to_f64())
          << dtype_name(src) << " -> " << dtype_name(dst);
    } else {
      Tensor out = Tensor::empty({71, 229}, dst, kGpu);
      ops::copy(out, p.d);
      EXPECT_EQ(out.to_f64(), ref.to_f64()) << dtype_name(src) << " -> bool";
    }
    // Host -> device with conversion, device -> host with conversion.
    Tensor up = Tensor::empty({71, 229}, dst, kGpu);
    ops::copy(up, p.h);
    EXPECT_EQ(up.to_f64(), ref.to_f64());
    Tensor down = Tensor::empty({71, 229}, dst);
    ops::copy(down, p.d);
    EXPECT_EQ(down.to_f64(), ref.to_f64());
  }
}

TEST_P(OpsCuda, StridedCopiesMatchTheHost) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  Pair p = rand_pair({71, 229}, dt, 13);
  // Transposed and narrowed sources.
  for (const auto& view : std::vector<std::function<Tensor(const Tensor&)>>{
           [](const Tensor& t) { return t.transpose(0, 1); },
           [](const Tensor& t) { return t.narrow(1, 3, 100); },
           [](const Tensor& t) { return t.narrow(0, 5, 19).transpose(0, 1).narrow(0, 1, 7); }}) {
    Tensor vd = view(p.d), vh = view(p.h);
    EXPECT_EQ(vd.contiguous().to_f64(), vh.contiguous().to_f64());
    // Into a strided destination on the device, with and without a dtype change.
    for (DType out_dt : {dt, DType::kF32}) {
      Tensor dst_d = Tensor::zeros({vd.size(1), vd.size(0)}, out_dt, kGpu).transpose(0, 1);
      Tensor dst_h = Tensor::zeros({vd.size(1), vd.size(0)}, out_dt).transpose(0, 1);
      ops::copy(dst_d, vd);
      ops::copy(dst_h, vh);
      EXPECT_EQ(dst_d.to_f64(), dst_h.to_f64());
      // Host strided source into a strided device destination.
      Tensor dst2 = Tensor::zeros({vd.size(1), vd.size(0)}, out_dt, kGpu).transpose(0, 1);
      ops::copy(dst2, vh);
      EXPECT_EQ(dst2.to_f64(), dst_h.to_f64());
      // Device strided source into a strided host destination.
      Tensor dst3 = Tensor::zeros({vd.size(1), vd.size(0)}, out_dt).transpose(0, 1);
      ops::copy(dst3, vd);
      EXPECT_EQ(dst3.to_f64(), dst_h.to_f64());
    }
  }
}

TEST_P(OpsCuda, FillContiguousAndStrided) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  for (double v : {0.0, -3.25, 1e30}) {
    Guarded g({71, 229}, dt, kGpu);
    ops::fill(g.payload(), v);
    EXPECT_TRUE(g.check());
    Tensor ref = Tensor::full({71, 229}, v, dt);
    EXPECT_EQ(g.payload().to_f64(), ref.to_f64()) << v;
  }
  Pair p = rand_pair({19, 71}, dt, 14);
  ops::fill(p.d.narrow(1, 2, 5), 7.5);
  ops::fill(p.h.narrow(1, 2, 5), 7.5);
  ops::fill(p.d.transpose(0, 1).narrow(0, 60, 11), -1.0);
  ops::fill(p.h.transpose(0, 1).narrow(0, 60, 11), -1.0);
  EXPECT_EQ(p.d.to_f64(), p.h.to_f64());
}

TEST_P(OpsCuda, BinaryOpsWithBroadcastsMatchTheHost) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  for (const Shape& s : kShapes) {
    Pair a = rand_pair(s, dt, 21);
    Shape row(s.end() - 1, s.end());
    for (const Shape& bs : {s, Shape{1}, row}) {
      Pair b = uniform_pair(bs, dt, 22, 0.5, 2.0);  // away from 0 for div
      const Tol t = gpu_tol(dt, 4.0);
      EXPECT_TRUE(all_close(ops::add(a.d, b.d, 0.75), ops::add(a.h, b.h, 0.75), t));
      EXPECT_TRUE(all_close(ops::sub(a.d, b.d), ops::sub(a.h, b.h), t));
      EXPECT_TRUE(all_close(ops::mul(a.d, b.d), ops::mul(a.h, b.h), t));
      EXPECT_TRUE(all_close(ops::div(a.d, b.d), ops::div(a.h, b.h), t));
      // In place into a guarded buffer.
      Guarded g(s, dt, kGpu);
      ops::copy(g.payload(), a.d);
      ops::add_(g.payload(), b.d, -2.0);
      ops::mul_(g.payload(), b.d);
      Tensor r = a.h.clone();
      ops::add_(r, b.h, -2.0);
      ops::mul_(r, b.h);
      EXPECT_TRUE(g.check());
      EXPECT_TRUE(all_close(g.payload(), r, t)) << shape_str(s) << " b " << shape_str(bs);
    }
  }
  // b of another dtype is converted to a's first; a strided a is read through its view.
  Pair a = rand_pair({71, 229}, dt, 23);
  Pair b = rand_pair({229}, DType::kF32, 24);
  EXPECT_TRUE(all_close(ops::add(a.d, b.d), ops::add(a.h, b.h), gpu_tol(dt, 4.0)));
  Pair c = rand_pair({229, 71}, dt, 25);
  EXPECT_TRUE(all_close(ops::mul(c.d.transpose(0, 1), a.d), ops::mul(c.h.transpose(0, 1), a.h),
                        gpu_tol(dt, 4.0)));
}

TEST_P(OpsCuda, UnaryAffineAndScaleMatchTheHost) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  for (const Shape& s : kShapes) {
    Pair x = rand_pair(s, dt, 31, 3.0);
    Pair pos = uniform_pair(s, dt, 32, 0.01, 5.0);
    const Tol t = gpu_tol(dt, 2.0);
    for (ops::Unary op : {ops::Unary::kNeg, ops::Unary::kExp, ops::Unary::kSigmoid,
                          ops::Unary::kLogSigmoid, ops::Unary::kTanh, ops::Unary::kRelu,
                          ops::Unary::kSquare, ops::Unary::kAbs, ops::Unary::kSilu}) {
      EXPECT_TRUE(all_close(ops::unary(x.d, op), ops::unary(x.h, op), t))
          << "op " << static_cast<int>(op) << " " << shape_str(s);
    }
    for (ops::Unary op : {ops::Unary::kLog, ops::Unary::kSqrt})
      EXPECT_TRUE(all_close(ops::unary(pos.d, op), ops::unary(pos.h, op), t));
    EXPECT_TRUE(all_close(ops::affine(x.d, -1.5, 0.25), ops::affine(x.h, -1.5, 0.25), t));
    EXPECT_TRUE(all_close(ops::scale(x.d, 3.0), ops::scale(x.h, 3.0), t));
    Guarded g(s, dt, kGpu);
    ops::copy(g.payload(), x.d);
    ops::scale_(g.payload(), -0.125);
    Tensor r = x.h.clone();
    ops::scale_(r, -0.125);
    EXPECT_TRUE(g.check());
    EXPECT_TRUE(all_close(g.payload(), r, t));
  }
}

TEST_P(OpsCuda, ReductionsMatchTheHost) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  for (const Shape& s : kShapes) {
    Pair x = rand_pair(s, dt, 41);
    const double n = static_cast<double>(x.h.numel());
    // Sums accumulate in double on both sides; the f32 output rounds once.
    EXPECT_TRUE(all_close(ops::sum(x.d), ops::sum(x.h), 1e-6 * std::sqrt(n), 1e-6));
    EXPECT_NEAR(ops::sum_squares(x.d), ops::sum_squares(x.h), 1e-9 * n);
    EXPECT_EQ(ops::max_abs(x.d), ops::max_abs(x.h));
    EXPECT_TRUE(ops::all_finite(x.d));
    EXPECT_TRUE(all_close(ops::max_last(x.d), ops::max_last(x.h), 0.0, 0.0));
    EXPECT_EQ(ops::argmax_last(x.d).to_i64(), ops::argmax_last(x.h).to_i64());
    for (int64_t dim = 0; dim < x.h.dim(); ++dim)
      for (bool keep : {false, true})
        EXPECT_TRUE(all_close(ops::sum_dim(x.d, dim, keep), ops::sum_dim(x.h, dim, keep),
                              gpu_tol(dt, std::sqrt(static_cast<double>(x.h.size(dim))))))
            << shape_str(s) << " dim " << dim;
  }
  // A long reduced dimension (split reduction) and a strided input.
  Pair big = rand_pair({4093, 3, 5}, dt, 42);
  EXPECT_TRUE(all_close(ops::sum_dim(big.d, 0), ops::sum_dim(big.h, 0), gpu_tol(dt, 64.0)));
  EXPECT_TRUE(all_close(ops::sum_dim(big.d.transpose(0, 2), 2),
                        ops::sum_dim(big.h.transpose(0, 2), 2), gpu_tol(dt, 64.0)));
}

TEST_P(OpsCuda, ReductionSpecialValues) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  // Rows: ties (first maximum wins), NaN first (argmax 0), NaN inside (ignored by max), all -inf.
  std::vector<double> v = {1, 3, 3, -2, nan, 5, 1, 2, 0, nan, 4, 4, -inf, -inf, -inf, -inf};
  Tensor h = Tensor::from_doubles(v, {4, 4}, dt);
  Tensor d = h.to(kGpu);
  EXPECT_EQ(ops::argmax_last(d).to_i64(), ops::argmax_last(h).to_i64());
  EXPECT_TRUE(all_close(ops::max_last(d), ops::max_last(h), 0.0, 0.0));
  EXPECT_TRUE(std::isnan(ops::max_abs(d)));
  EXPECT_FALSE(ops::all_finite(d));
  Tensor fin = Tensor::from_doubles({1, 2, inf}, {3}, dt).to(kGpu);
  EXPECT_FALSE(ops::all_finite(fin));
  EXPECT_EQ(ops::max_abs(fin), inf);
}

TEST_P(OpsCuda, SoftmaxAndLogSoftmaxMatchTheHost) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  for (const Shape& s :
       {Shape{1, 1}, Shape{19, 19}, Shape{71, 229}, Shape{4, 4864}, Shape{2, 151936}}) {
    Pair x = rand_pair(s, dt, 51, 4.0);
    EXPECT_TRUE(all_close(ops::softmax_last(x.d), ops::softmax_last(x.h), gpu_tol(dt, 1e-3)))
        << shape_str(s);
    EXPECT_TRUE(
        all_close(ops::log_softmax_last(x.d), ops::log_softmax_last(x.h), gpu_tol(dt, 10.0)))
        << shape_str(s);
  }
}

TEST_P(OpsCuda, IndexRowsWithHostAndDeviceIds) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  Pair table = rand_pair({229, 71}, dt, 61);
  std::vector<int64_t> ids = {0, 228, 5, 5,   100, 17, 228, 1,  0, 64,
                              3, 3,   3, 200, 9,   10, 11,  12, 13};
  Tensor ih = Tensor::from_vector(ids, {19});
  Tensor ref = ops::index_rows(table.h, ih);
  EXPECT_EQ(ops::index_rows(table.d, ih).to_f64(), ref.to_f64());
  EXPECT_EQ(ops::index_rows(table.d, ih.to(kGpu)).to_f64(), ref.to_f64());
  EXPECT_EQ(ops::index_rows(table.d, ih.to(DType::kI32).to(kGpu)).to_f64(), ref.to_f64());
  // 16-byte rows (the vector path) and a narrowed table (a strided view).
  Pair wide = rand_pair({64, 896}, dt, 62);
  Tensor ih2 = Tensor::from_vector(std::vector<int64_t>{63, 0, 7}, {3});
  EXPECT_EQ(ops::index_rows(wide.d, ih2.to(kGpu)).to_f64(), ops::index_rows(wide.h, ih2).to_f64());
  EXPECT_EQ(ops::index_rows(wide.d.narrow(1, 1, 19), ih2).to_f64(),
            ops::index_rows(wide.h.narrow(1, 1, 19), ih2).to_f64());
  // An out-of-range id is an Error, from host and from device ids.
  Tensor bad = Tensor::from_vector(std::vector<int64_t>{1, 229}, {2});
  EXPECT_THROW(ops::index_rows(table.d, bad), Error);
  EXPECT_THROW(ops::index_rows(table.d, bad.to(kGpu)), Error);
  Tensor neg = Tensor::from_vector(std::vector<int32_t>{-1}, {1}).to(kGpu);
  EXPECT_THROW(ops::index_rows(table.d, neg), Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OpsCuda,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kF64),
                         dt_name);

// ---------------------------------------------------------------- gemm

struct GemmCase {
  DType dt;
  DType c_dt;
  int64_t m, n, k;
  bool ta, tb;
};

std::string gemm_name(const ::testing::TestParamInfo<GemmCase>& p) {
  const GemmCase& c = p.param;
  return std::string(dtype_name(c.dt)) + "_" + dtype_name(c.c_dt) + "_" + std::to_string(c.m) +
         "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + (c.ta ? "_ta" : "") +
         (c.tb ? "_tb" : "");
}

class GemmCuda : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmCuda, MatchesHostGemm) {
  LT_SKIP_WITHOUT_CUDA();
  const GemmCase c = GetParam();
  Pair a = rand_pair(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, c.dt, 71);
  Pair b = rand_pair(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, c.dt, 72);
  Pair c0 = rand_pair({c.m, c.n}, c.c_dt, 73);
  // Both sides sum the same (rounded) inputs in f32 (f64), in different orders: the absolute
  // error scales with k for unit-variance data; 16-bit outputs may round one ulp apart.
  const DType tol_dt = c.c_dt == DType::kF32 && c.dt != DType::kF32 ? DType::kBF16 : c.c_dt;
  const Tol t = gpu_tol(tol_dt, static_cast<double>(c.k));
  for (double beta : {0.0, 0.5}) {
    Tensor cd = c0.d.clone(), ch = c0.h.clone();
    ops::gemm(a.d, c.ta, b.d, c.tb, cd, 1.25, beta);
    ops::gemm(a.h, c.ta, b.h, c.tb, ch, 1.25, beta);
    EXPECT_TRUE(all_close(cd, ch, t)) << "beta " << beta;
  }
  // The same product through transposed views (taken as they are, without a copy).
  Tensor at_d = a.d.transpose(0, 1).contiguous().transpose(0, 1);
  Tensor out_d = Tensor::empty({c.m, c.n}, c.c_dt, kGpu);
  Tensor out_h = Tensor::empty({c.m, c.n}, c.c_dt);
  ops::gemm(at_d, c.ta, b.d, c.tb, out_d);
  ops::gemm(a.h, c.ta, b.h, c.tb, out_h);
  EXPECT_TRUE(all_close(out_d, out_h, t));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmCuda,
    ::testing::Values(GemmCase{DType::kF32, DType::kF32, 1, 1, 1, false, false},
                      GemmCase{DType::kF32, DType::kF32, 19, 71, 229, false, true},
                      GemmCase{DType::kF32, DType::kF32, 71, 19, 229, true, false},
                      GemmCase{DType::kBF16, DType::kBF16, 71, 229, 19, false, true},
                      GemmCase{DType::kBF16, DType::kBF16, 64, 896, 896, false, true},
                      GemmCase{DType::kBF16, DType::kF32, 896, 128, 4864, true, false},
                      GemmCase{DType::kF16, DType::kF16, 19, 229, 71, true, true},
                      GemmCase{DType::kF64, DType::kF64, 19, 71, 229, true, false},
                      GemmCase{DType::kBF16, DType::kBF16, 1, 4864, 896, false, true}),
    gemm_name);

class GemmCudaEdge : public ::testing::TestWithParam<DType> {};

TEST_P(GemmCudaEdge, EmptyKAndMixedDtypes) {
  LT_SKIP_WITHOUT_CUDA();
  const DType dt = GetParam();
  // k == 0: c = beta * c.
  Pair c0 = rand_pair({3, 5}, dt, 81);
  Tensor a = Tensor::empty({3, 0}, dt, kGpu), b = Tensor::empty({0, 5}, dt, kGpu);
  Tensor cd = c0.d.clone();
  ops::gemm(a, false, b, false, cd, 1.0, 0.5);
  Tensor ch = ops::scale(c0.h, 0.5);
  EXPECT_TRUE(all_close(cd, ch, gpu_tol(dt)));
  // Mixed inputs compute in f32 (as the host does) and round into c.
  Pair x = rand_pair({19, 71}, dt, 82);
  Pair y = rand_pair({71, 23}, DType::kF32, 83);
  Tensor od = Tensor::empty({19, 23}, dt, kGpu), oh = Tensor::empty({19, 23}, dt);
  ops::gemm(x.d, false, y.d, false, od);
  ops::gemm(x.h, false, y.h, false, oh);
  EXPECT_TRUE(all_close(od, oh, gpu_tol(dt, 10.0)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GemmCudaEdge,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16), dt_name);

}  // namespace
}  // namespace leantune
