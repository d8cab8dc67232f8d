// The single-process communicator: world of one, every collective the identity or a copy, send
// and recv to oneself through a queue; and the factory's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/check.h"
#include "engine/comm.h"
#include "engine/comm_fold.h"

namespace leantune {
namespace {

TEST(CommSingle, CollectivesAreIdentityOrCopy) {
  auto c = make_single_communicator();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->backend_name(), "single");
  for (int64_t n : {int64_t{1}, int64_t{19}, int64_t{71 * 229}}) {
    std::vector<double> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = 0.25 * i - 3;
    Tensor x = Tensor::from_doubles(v, {n}, DType::kBF16);
    Tensor before = x.clone();
    c->all_reduce(x, ReduceOp::kAvg);
    EXPECT_EQ(std::memcmp(x.data_ptr(), before.data_ptr(), x.nbytes()), 0);
    Tensor out = Tensor::empty({n}, DType::kBF16);
    c->reduce_scatter(x, out);
    EXPECT_EQ(out.to_f64(), x.to_f64());
    Tensor g = Tensor::empty({n}, DType::kBF16);
    c->all_gather(x, g);
    EXPECT_EQ(g.to_f64(), x.to_f64());
    c->broadcast(x, 0);
    EXPECT_THROW(c->broadcast(x, 1), Error);
  }
  EXPECT_EQ(c->all_reduce_scalar(2.5), 2.5);
  EXPECT_EQ(c->all_reduce_int(7), 7);
  EXPECT_EQ(c->all_gather_scalar(1.5), std::vector<double>{1.5});
  EXPECT_EQ(c->split(3, 0)->size(), 1);
}

TEST(CommSingle, SendToSelfInAGroup) {
  auto c = make_single_communicator();
  Tensor a = Tensor::from_doubles({1, 2, 3}, {3}, DType::kF32);
  Tensor b = Tensor::zeros({3}, DType::kF32);
  c->group_start();
  c->send(a, 0);
  c->recv(b, 0);
  c->group_end();
  EXPECT_EQ(b.to_f64(), (std::vector<double>{1, 2, 3}));
  // Outside a group, a receive with no send would wait forever: an error instead.
  EXPECT_THROW(c->recv(b, 0), Error);
  EXPECT_THROW(c->send(a, 1), Error);
}

// Quantized weights (u8 packed NF4, i8 rows) move through the data-movement collectives; a
// reduction refuses them, as fold_rank_order cannot sum them.
TEST(CommSingle, BytesMoveButDoNotReduce) {
  auto c = make_single_communicator();
  Tensor u = Tensor::from_vector<uint8_t>({0, 7, 255, 128, 3}, {5});
  Tensor i = Tensor::from_vector<int8_t>({-127, 0, 127}, {3});
  Tensor g = Tensor::empty({5}, DType::kU8);
  c->all_gather(u, g);
  EXPECT_EQ(std::memcmp(g.data_ptr(), u.data_ptr(), 5), 0);
  c->broadcast(i, 0);
  Tensor got = Tensor::zeros({3}, DType::kI8);
  c->group_start();
  c->send(i, 0);
  c->recv(got, 0);
  c->group_end();
  EXPECT_EQ(std::memcmp(got.data_ptr(), i.data_ptr(), 3), 0);
  EXPECT_THROW(c->all_reduce(u), Error);
  EXPECT_THROW(c->reduce_scatter(u, g), Error);
  EXPECT_TRUE(comm_detail::comm_dtype_movable(DType::kU8));
  EXPECT_FALSE(comm_detail::comm_dtype_reducible(DType::kU8));
  EXPECT_TRUE(comm_detail::comm_dtype_reducible(DType::kBF16));
  EXPECT_FALSE(comm_detail::comm_dtype_movable(DType::kI16));
  // Every dtype that reduces also moves.
  for (int d = 0; d < kNumDTypes; ++d) {
    const DType t = static_cast<DType>(d);
    if (comm_detail::comm_dtype_reducible(t)) {
      EXPECT_TRUE(comm_detail::comm_dtype_movable(t)) << dtype_name(t);
    }
  }
}

TEST(CommFold, RankOrderIsTheFoldOfALoop) {
  // f32: ((a + b) + c) exactly, not a + (b + c).
  const float in[3] = {1e8f, -1e8f, 1.0f};
  float out = 0;
  comm_detail::fold_rank_order(in, 3, 1, DType::kF32, ReduceOp::kSum, &out);
  EXPECT_EQ(out, (1e8f + -1e8f) + 1.0f);
  // bf16 folds in f32 and rounds once: 256 + 1 + 1 = 258 is exact in f32, and representable.
  const uint16_t h[3] = {f32_to_bf16(256), f32_to_bf16(1), f32_to_bf16(1)};
  uint16_t r = 0;
  comm_detail::fold_rank_order(h, 3, 1, DType::kBF16, ReduceOp::kSum, &r);
  EXPECT_EQ(bf16_to_f32(r), 258.0f);  // pairwise in bf16 would give 256 + 1 -> 256, then 256
  // A NaN anywhere wins a max.
  const float m[3] = {1, std::numeric_limits<float>::quiet_NaN(), 3};
  comm_detail::fold_rank_order(m, 3, 1, DType::kF32, ReduceOp::kMax, &out);
  EXPECT_TRUE(std::isnan(out));
}

TEST(CommFactory, RefusesBadOptionsInOneLine) {
  CommOptions o;
  o.backend = "gloo";
  try {
    (void)world_communicator(o);
    FAIL() << "accepted --comm_backend gloo";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("--comm_backend gloo"), std::string::npos);
  }
  o.backend = "auto";
  o.timeout_seconds = 0;
  EXPECT_THROW((void)world_communicator(o), Error);
  o.timeout_seconds = 600;
  Communicator& w = world_communicator(o);
  EXPECT_EQ(w.size(), 1);
  EXPECT_EQ(&world_communicator(), &w);
  EXPECT_TRUE(world_communicator_started());
}

}  // namespace
}  // namespace leantune
