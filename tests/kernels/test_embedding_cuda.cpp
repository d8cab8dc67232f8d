// GPU tier for embedding (kernels/embedding.cu): the row gather and the deterministic sorted
// backward against the CPU path on host copies, with host and device ids (i32 and i64), repeated
// ids (long runs), ids at 0 and V-1, out-of-range ids, guard bands and autograd.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/autograd.h"
#include "kernels/embedding.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::all_close;
using testing::Guarded;
using testing::Tol;

const Device kGpu = Device::cuda(0);

struct Case {
  DType dt;
  int64_t t, v, h;
};

std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  const Case& c = p.param;
  return std::string(dtype_name(c.dt)) + "_T" + std::to_string(c.t) + "_V" + std::to_string(c.v) +
         "_H" + std::to_string(c.h);
}

// Ids with repeats: a long run of one id (like padding), the first and last ids, the rest
// pseudo-random.
Tensor make_ids(int64_t t, int64_t v, DType dt) {
  std::vector<int64_t> ids(static_cast<size_t>(t));
  uint64_t s = 12345;
  for (int64_t i = 0; i < t; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(v));
  }
  for (int64_t i = t / 2; i < t && i < t / 2 + 40; ++i) ids[i] = v / 3;
  if (t > 0) ids[0] = v - 1;
  if (t > 1) ids[t - 1] = 0;
  Tensor out = Tensor::from_vector(ids, {t});
  return dt == DType::kI64 ? out : out.to(dt);
}

class EmbeddingCuda : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingCuda, ForwardGathersExactly) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor w = testing::randn({c.v, c.h}, c.dt, 601);
  const Tensor wd = w.to(kGpu);
  for (DType idt : {DType::kI64, DType::kI32}) {
    Tensor ids = make_ids(c.t, c.v, idt);
    Tensor ref = Tensor::empty({c.t, c.h}, c.dt);
    kernels::embedding_fwd(w, ids, ref);
    Guarded y({c.t, c.h}, c.dt, kGpu);
    kernels::embedding_fwd_cuda(wd, ids, y.payload());
    EXPECT_TRUE(y.check());
    EXPECT_EQ(y.payload().to_f64(), ref.to_f64());
    Tensor y2 = Tensor::empty({c.t, c.h}, c.dt, kGpu);
    kernels::embedding_fwd_cuda(wd, ids.to(kGpu), y2);
    EXPECT_EQ(y2.to_f64(), ref.to_f64());
  }
}

// Sums of the same (rounded) rows in the same order: identical to the CPU path.
TEST_P(EmbeddingCuda, BackwardMatchesCpuAndIsDeterministic) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor dy = testing::randn({c.t, c.h}, c.dt, 611);
  for (DType idt : {DType::kI64, DType::kI32}) {
    Tensor ids = make_ids(c.t, c.v, idt);
    Tensor ref = Tensor::empty({c.v, c.h}, c.dt);
    kernels::embedding_bwd(dy, ids, ref);
    Guarded dw({c.v, c.h}, c.dt, kGpu);
    ops::fill(dw.payload(), 3.0);  // overwritten, not accumulated
    kernels::embedding_bwd_cuda(dy.to(kGpu), ids.to(kGpu), dw.payload());
    EXPECT_TRUE(dw.check());
    EXPECT_EQ(dw.payload().to_f64(), ref.to_f64()) << dtype_name(idt);
    Tensor dw2 = Tensor::empty({c.v, c.h}, c.dt, kGpu);
    kernels::embedding_bwd_cuda(dy.to(kGpu), ids, dw2);
    EXPECT_EQ(dw2.to_f64(), ref.to_f64());
  }
  // f32 gradient for 16-bit dy (the accumulation dtype of bf16 weights).
  Tensor ids = make_ids(c.t, c.v, DType::kI64);
  Tensor ref32 = Tensor::empty({c.v, c.h}, DType::kF32);
  kernels::embedding_bwd(dy, ids, ref32);
  Tensor dw32 = Tensor::empty({c.v, c.h}, DType::kF32, kGpu);
  kernels::embedding_bwd_cuda(dy.to(kGpu), ids.to(kGpu), dw32);
  EXPECT_EQ(dw32.to_f64(), ref32.to_f64());
}

TEST_P(EmbeddingCuda, OutOfRangeIdsAreErrors) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor w = testing::randn({c.v, c.h}, c.dt, 621).to(kGpu);
  for (int64_t bad : {c.v, int64_t{-1}}) {
    std::vector<int64_t> v(static_cast<size_t>(c.t), 0);
    v[static_cast<size_t>(c.t - 1)] = bad;
    Tensor ids = Tensor::from_vector(v, {c.t});
    Tensor y = Tensor::empty({c.t, c.h}, c.dt, kGpu);
    EXPECT_THROW(kernels::embedding_fwd_cuda(w, ids, y), Error);
    EXPECT_THROW(kernels::embedding_fwd_cuda(w, ids.to(kGpu), y), Error);
    Tensor dw = Tensor::empty({c.v, c.h}, c.dt, kGpu);
    Tensor dy = Tensor::zeros({c.t, c.h}, c.dt, kGpu);
    EXPECT_THROW(kernels::embedding_bwd_cuda(dy, ids.to(kGpu), dw), Error);
  }
}

TEST_P(EmbeddingCuda, AutogradOnDeviceMatchesCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Case c = GetParam();
  Tensor w = testing::randn({c.v, c.h}, c.dt, 631);
  Tensor ids = make_ids(c.t, c.v, DType::kI64);
  Tensor dy = testing::randn({c.t, c.h}, c.dt, 632);
  Tensor wh = w.clone().set_requires_grad(true), wd = w.to(kGpu).set_requires_grad(true);
  Tensor yh = kernels::embedding(wh, ids), yd = kernels::embedding(wd, ids.to(kGpu));
  EXPECT_EQ(yd.to_f64(), yh.to_f64());
  yh.backward(dy);
  yd.backward(dy.to(kGpu));
  EXPECT_EQ(wd.grad().to_f64(), wh.grad().to_f64());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmbeddingCuda,
    ::testing::Values(Case{DType::kF32, 1, 1, 1}, Case{DType::kBF16, 1, 1, 1},
                      Case{DType::kF32, 19, 7, 19}, Case{DType::kBF16, 19, 7, 19},
                      Case{DType::kF32, 229, 71, 229}, Case{DType::kBF16, 229, 71, 229},
                      Case{DType::kF16, 229, 71, 229}, Case{DType::kBF16, 1000, 4864, 896},
                      Case{DType::kF32, 300, 151936, 64}, Case{DType::kF64, 71, 19, 33}),
    case_name);

}  // namespace
}  // namespace leantune
