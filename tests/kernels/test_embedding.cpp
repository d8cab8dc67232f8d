#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/embedding.h"

namespace leantune {
namespace {

using kernel_test::make;
using kernel_test::near_ref;
using kernel_test::Vec;
using testing::Guarded;
using testing::randn;

struct EmbCase {
  DType dt;
  DType id_dt;
  int64_t v, h, t;
};

std::string emb_name(const ::testing::TestParamInfo<EmbCase>& i) {
  const EmbCase& c = i.param;
  return std::string(dtype_name(c.dt)) + "_ids" + dtype_name(c.id_dt) + "_V" + std::to_string(c.v) +
         "_H" + std::to_string(c.h) + "_T" + std::to_string(c.t);
}

// Ids with many repeats (t > v in most cases) and both ends of the vocabulary present.
Tensor make_ids(int64_t t, int64_t v, DType id_dt, uint64_t seed) {
  std::vector<double> ids(static_cast<size_t>(t));
  Generator g(seed, RngPurpose::kTest);
  for (int64_t i = 0; i < t; ++i) ids[i] = static_cast<double>(g.next_below(v));
  if (t >= 2) {
    ids[0] = 0;
    ids[t - 1] = static_cast<double>(v - 1);
  }
  return make(ids, {t}, id_dt);
}

class EmbeddingTest : public ::testing::TestWithParam<EmbCase> {};

TEST_P(EmbeddingTest, ForwardCopiesRowsIntoGuardedOutput) {
  const EmbCase c = GetParam();
  Tensor w = randn({c.v, c.h}, c.dt, 1);
  Tensor ids = make_ids(c.t, c.v, c.id_dt, 2);
  Guarded y({c.t, c.h}, c.dt, Device::cpu());
  kernels::embedding_fwd(w, ids, y.payload());
  EXPECT_TRUE(y.check());
  Vec wv = w.to_f64(), yv = y.payload().to_f64();
  std::vector<int64_t> id = ids.to_i64();
  Vec ref;
  for (int64_t t = 0; t < c.t; ++t)
    for (int64_t j = 0; j < c.h; ++j) ref.push_back(wv[id[t] * c.h + j]);
  EXPECT_EQ(yv, ref);  // a gather is exact
}

TEST_P(EmbeddingTest, BackwardSumsRepeatedIdsLikeFloat64Reference) {
  const EmbCase c = GetParam();
  Tensor ids = make_ids(c.t, c.v, c.id_dt, 3);
  Tensor dy = randn({c.t, c.h}, c.dt, 4);
  Guarded dw({c.v, c.h}, c.dt, Device::cpu());
  dw.payload().fill_(7.0);  // must be overwritten, rows without ids included
  kernels::embedding_bwd(dy, ids, dw.payload());
  EXPECT_TRUE(dw.check());
  Vec g = dy.to_f64();
  std::vector<int64_t> id = ids.to_i64();
  Vec ref(static_cast<size_t>(c.v * c.h), 0.0);
  for (int64_t t = 0; t < c.t; ++t)
    for (int64_t j = 0; j < c.h; ++j) ref[id[t] * c.h + j] += g[t * c.h + j];
  // One rounding of an f32 (f64) sum: the dtype's own tolerance.
  EXPECT_TRUE(near_ref(dw.payload(), ref, kernel_test::scaled_tol(c.dt, 1.0)));
}

TEST_P(EmbeddingTest, AutogradGivesTheSameWeightGradient) {
  const EmbCase c = GetParam();
  Tensor w = randn({c.v, c.h}, c.dt, 5);
  w.set_requires_grad(true);
  Tensor ids = make_ids(c.t, c.v, c.id_dt, 6);
  Tensor dy = randn({c.t, c.h}, c.dt, 7);
  Tensor y = kernels::embedding(w, ids);
  ASSERT_TRUE(y.requires_grad());
  y.backward(dy);
  Tensor ref = Tensor::empty({c.v, c.h}, c.dt);
  kernels::embedding_bwd(dy, ids, ref);
  EXPECT_TRUE(testing::all_close(w.grad(), ref, 0.0, 0.0));
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingTest,
                         ::testing::Values(EmbCase{DType::kF32, DType::kI64, 1, 1, 1},
                                           EmbCase{DType::kF32, DType::kI32, 19, 19, 19},
                                           EmbCase{DType::kF32, DType::kI64, 71, 229, 300},
                                           EmbCase{DType::kBF16, DType::kI32, 71, 229, 300},
                                           EmbCase{DType::kF16, DType::kI64, 19, 64, 71},
                                           EmbCase{DType::kF64, DType::kI32, 23, 8, 0}),
                         emb_name);

TEST(Embedding, GradcheckFloat64) {
  Tensor ids = make_ids(13, 7, DType::kI64, 8);
  auto f = [ids](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::embedding(in[0], ids)};
  };
  EXPECT_TRUE(testing::gradcheck(f, {randn({7, 5}, DType::kF64, 9)}));
}

TEST(Embedding, StridedWeightIsRead) {
  Tensor base = randn({9, 12}, DType::kF32, 10);
  Tensor w = base.narrow(1, 2, 5);  // [9, 5], row stride 12
  Tensor ids = make({8, 0, 3}, {3}, DType::kI64);
  Tensor y = kernels::embedding(w, ids);
  EXPECT_TRUE(testing::all_close(y.narrow(0, 1, 1), w.narrow(0, 0, 1), 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(y.narrow(0, 0, 1), w.narrow(0, 8, 1), 0.0, 0.0));
}

TEST(Embedding, OutOfRangeIdIsAnErrorNamingTheId) {
  Tensor w = randn({10, 4}, DType::kF32, 11);
  for (double bad : {10.0, -1.0}) {
    Tensor ids = make({1, bad, 2}, {3}, DType::kI32);
    try {
      kernels::embedding(w, ids);
      FAIL() << "no error for id " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(static_cast<int>(bad))),
                std::string::npos)
          << e.what();
    }
    Tensor dw = Tensor::empty({10, 4}, DType::kF32);
    EXPECT_THROW(kernels::embedding_bwd(randn({3, 4}, DType::kF32, 12), ids, dw), Error);
  }
}

TEST(Embedding, FrozenWeightRecordsNoHistory) {
  Tensor w = randn({6, 3}, DType::kF32, 13);
  Tensor y = kernels::embedding(w, make({1, 2}, {2}, DType::kI64));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
}

}  // namespace
}  // namespace leantune
