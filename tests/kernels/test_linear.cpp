#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/linear.h"

namespace leantune {
namespace {

using kernel_test::near_ref;
using kernel_test::scaled_tol;
using kernel_test::Vec;
using testing::Guarded;
using testing::randn;

struct LinCase {
  DType dt;
  int64_t t, in, out;
  bool bias;
};

std::string lin_name(const ::testing::TestParamInfo<LinCase>& i) {
  const LinCase& c = i.param;
  return std::string(dtype_name(c.dt)) + "_T" + std::to_string(c.t) + "_in" + std::to_string(c.in) +
         "_out" + std::to_string(c.out) + (c.bias ? "_bias" : "_nobias");
}

// Float64 references over the (already rounded) input values.
Vec ref_forward(const Vec& x, const Vec& w, const Vec* b, int64_t t, int64_t in, int64_t out) {
  Vec y(static_cast<size_t>(t * out));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int64_t k = 0; k < in; ++k) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
  return y;
}

class LinearTest : public ::testing::TestWithParam<LinCase> {};

TEST_P(LinearTest, ForwardMatchesFloat64Reference) {
  const LinCase c = GetParam();
  Tensor x = randn({c.t, c.in}, c.dt, 1);
  Tensor w = randn({c.out, c.in}, c.dt, 2);
  Tensor b = c.bias ? randn({c.out}, c.dt, 3) : Tensor();
  Guarded y({c.t, c.out}, c.dt, Device::cpu());
  kernels::linear_fwd(x, w, b, y.payload());
  EXPECT_TRUE(y.check());
  Vec bv = c.bias ? b.to_f64() : Vec();
  Vec ref = ref_forward(x.to_f64(), w.to_f64(), c.bias ? &bv : nullptr, c.t, c.in, c.out);
  EXPECT_TRUE(near_ref(y.payload(), ref, scaled_tol(c.dt, std::sqrt(double(c.in)))));
}

TEST_P(LinearTest, BackwardMatchesFloat64Reference) {
  const LinCase c = GetParam();
  Tensor x = randn({c.t, c.in}, c.dt, 4);
  Tensor w = randn({c.out, c.in}, c.dt, 5);
  Tensor dy = randn({c.t, c.out}, c.dt, 6);
  Guarded dx({c.t, c.in}, c.dt, Device::cpu()), dw({c.out, c.in}, c.dt, Device::cpu()),
      db({c.out}, c.dt, Device::cpu());
  kernels::linear_bwd(dy, x, w, dx.payload(), dw.payload(), c.bias ? db.payload() : Tensor());
  EXPECT_TRUE(dx.check());
  EXPECT_TRUE(dw.check());
  EXPECT_TRUE(db.check());
  Vec xv = x.to_f64(), wv = w.to_f64(), g = dy.to_f64();
  Vec rdx(static_cast<size_t>(c.t * c.in), 0.0), rdw(static_cast<size_t>(c.out * c.in), 0.0),
      rdb(static_cast<size_t>(c.out), 0.0);
  for (int64_t i = 0; i < c.t; ++i)
    for (int64_t o = 0; o < c.out; ++o) {
      const double gi = g[i * c.out + o];
      rdb[o] += gi;
      for (int64_t k = 0; k < c.in; ++k) {
        rdx[i * c.in + k] += gi * wv[o * c.in + k];
        rdw[o * c.in + k] += gi * xv[i * c.in + k];
      }
    }
  EXPECT_TRUE(near_ref(dx.payload(), rdx, scaled_tol(c.dt, std::sqrt(double(c.out)))));
  EXPECT_TRUE(near_ref(dw.payload(), rdw, scaled_tol(c.dt, std::sqrt(double(c.t)))));
  if (c.bias) {
    EXPECT_TRUE(near_ref(db.payload(), rdb, scaled_tol(c.dt, std::sqrt(double(c.t)))));
  }
}

TEST_P(LinearTest, AutogradMatchesRawBackward) {
  const LinCase c = GetParam();
  Tensor x = randn({c.t, c.in}, c.dt, 7).set_requires_grad(true);
  Tensor w = randn({c.out, c.in}, c.dt, 8).set_requires_grad(true);
  Tensor b = c.bias ? randn({c.out}, c.dt, 9).set_requires_grad(true) : Tensor();
  Tensor dy = randn({c.t, c.out}, c.dt, 10);
  kernels::linear(x, w, b).backward(dy);
  Tensor dx = Tensor::empty({c.t, c.in}, c.dt), dw = Tensor::empty({c.out, c.in}, c.dt);
  Tensor db = c.bias ? Tensor::empty({c.out}, c.dt) : Tensor();
  kernels::linear_bwd(dy, x.detach(), w.detach(), dx, dw, db);
  EXPECT_TRUE(testing::all_close(x.grad(), dx, 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(w.grad(), dw, 0.0, 0.0));
  if (c.bias) {
    EXPECT_TRUE(testing::all_close(b.grad(), db, 0.0, 0.0));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Values(LinCase{DType::kF32, 1, 1, 1, true},
                                           LinCase{DType::kF32, 19, 19, 19, false},
                                           LinCase{DType::kF32, 71, 229, 37, true},
                                           LinCase{DType::kBF16, 71, 229, 37, true},
                                           LinCase{DType::kBF16, 19, 64, 19, false},
                                           LinCase{DType::kF16, 19, 40, 23, true},
                                           LinCase{DType::kF64, 7, 5, 3, true},
                                           LinCase{DType::kF32, 0, 8, 5, true}),
                         lin_name);

TEST(Linear, GradcheckWithAndWithoutBias) {
  for (bool bias : {true, false}) {
    auto f = [bias](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{kernels::linear(in[0], in[1], bias ? in[2] : Tensor())};
    };
    EXPECT_TRUE(
        testing::gradcheck(f, {randn({5, 7}, DType::kF64, 11), randn({3, 7}, DType::kF64, 12),
                               randn({3}, DType::kF64, 13)}))
        << "bias " << bias;
  }
}

TEST(Linear, FrozenWeightGetsNoGradientAndNoWeightSizedWork) {
  // W is 512x512 f32 (1 MiB); x is tiny. Backward may allocate dx but nothing W-sized.
  Tensor w = randn({512, 512}, DType::kF32, 14);
  Tensor x = randn({2, 512}, DType::kF32, 15).set_requires_grad(true);
  Tensor y = kernels::linear(x, w);
  Tensor dy = randn({2, 512}, DType::kF32, 16);
  Allocator& a = allocator(Device::cpu());
  const int64_t before = a.stats().allocated.current;
  a.reset_peak_stats();
  y.backward(dy);
  const int64_t extra = a.stats().allocated.peak - before;
  EXPECT_FALSE(w.grad().defined());
  ASSERT_TRUE(x.grad().defined());
  EXPECT_LT(extra, 512 * 512 * 4 / 4) << "backward allocated " << extra << " bytes";
  Tensor dx = Tensor::empty({2, 512}, DType::kF32);
  kernels::linear_bwd(dy, Tensor(), w, dx, Tensor(), Tensor());
  EXPECT_TRUE(testing::all_close(x.grad(), dx, 0.0, 0.0));
}

TEST(Linear, StridedInputEqualsContiguous) {
  Tensor base = randn({6, 20}, DType::kF32, 17);
  Tensor x = base.narrow(1, 3, 9);
  Tensor w = randn({4, 9}, DType::kF32, 18);
  EXPECT_TRUE(
      testing::all_close(kernels::linear(x, w), kernels::linear(x.contiguous(), w), 0.0, 0.0));
}

TEST(Linear, ShapeMismatchIsAnError) {
  EXPECT_THROW(kernels::linear(randn({3, 4}, DType::kF32, 1), randn({5, 6}, DType::kF32, 2)),
               Error);
  EXPECT_THROW(kernels::linear(randn({3, 4}, DType::kF32, 1), randn({5, 4}, DType::kF32, 2),
                               randn({4}, DType::kF32, 3)),
               Error);
}

}  // namespace
}  // namespace leantune

namespace leantune {
namespace {

// Batch invariance on the CPU under ops::BatchInvariantGemmGuard: a row of x @ W^T is the same
// bits whether it is computed alone or among other rows, at any position (the generation engine
// relies on it: a prompt samples the same tokens in any batch). Without the guard OpenBLAS 0.3.21
// takes a lone row, and products under about a million multiply-adds, through other kernels.
TEST(Linear, RowsDoNotDependOnTheBatchUnderTheGuard) {
  ops::BatchInvariantGemmGuard invariant;
  // Qwen2.5-0.5B's k_proj (128 x 896), o_proj (896 x 896) and a tiny projection.
  for (const auto& [n, k] :
       {std::pair<int64_t, int64_t>{128, 896}, {896, 896}, {128, 4864}, {19, 71}})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const Tensor x = testing::randn({40, k}, dt, 71), w = testing::randn({n, k}, dt, 72);
      const Tensor b = testing::randn({n}, dt, 73);
      const std::vector<double> all = kernels::linear(x, w, b).to_f64();
      for (int64_t m : {1, 2, 3, 9, 17, 33}) {
        const int64_t at = 40 - m;  // the rows sit elsewhere in their tiles than in `all`
        const std::vector<double> part = kernels::linear(x.narrow(0, at, m), w, b).to_f64();
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j)
            ASSERT_EQ(part[i * n + j], all[(at + i) * n + j])
                << dtype_name(dt) << " " << n << "x" << k << " m " << m << " row " << i;
      }
    }
}

}  // namespace
}  // namespace leantune
