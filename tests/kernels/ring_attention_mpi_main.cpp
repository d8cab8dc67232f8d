// Zigzag ring attention (kernels/ring_attention.h) under mpirun -np cp (tests/kernels/
// ring_attention.cmake runs it with 1, 2 and 4 ranks): every rank builds the
// same padded global q/k/v, runs the ring forward on its zigzag rows, and compares them with
// single-process causal varlen attention over the whole batch (kernels/attention.h).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/comm.h"
#include "kernels/ring_attention.h"

namespace leantune::kernels {
namespace {

Tensor global_input(int64_t rows, int64_t heads, int64_t dim, double seed, DType dt) {
  std::vector<double> v(rows * heads * dim);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + seed);
  return Tensor::from_doubles(v, {rows, heads, dim}, dt);
}

class ZigzagRing : public ::testing::TestWithParam<DType> {};

TEST_P(ZigzagRing, ForwardMatchesSingleProcessAttention) {
  CommOptions o;
  o.backend = "mpi";
  o.timeout_seconds = 60;
  auto comm = world_communicator(o).duplicate(o);
  const int cp = comm->size(), r = comm->rank();
  const DType dt = GetParam();
  // Awkward lengths: 1, 19, 71 and an empty document, padded to multiples of 2cp.
  ZigzagLayout z = zigzag_layout({1, 19, 0, 71}, cp, r);
  const int64_t Tg = z.cu_seqlens_global.back();
  Tensor q = global_input(Tg, 4, 8, 0.1, dt), k = global_input(Tg, 2, 8, 1.7, dt),
         v = global_input(Tg, 2, 8, 2.9, dt);
  Tensor cu = Tensor::from_vector(z.cu_seqlens_global, {5});
  AttentionOutput ref = attention(q, k, v, cu, cu);
  AttentionOutput got = zigzag_ring_attention_fwd(
      *comm, zigzag_local_rows(q, z), zigzag_local_rows(k, z), zigzag_local_rows(v, z), z);
  std::vector<double> want = zigzag_local_rows(ref.out, z).to_f64();
  std::vector<double> out = got.out.to_f64();
  const double tol = dt == DType::kF64 ? 1e-12 : 2e-6;
  ASSERT_EQ(want.size(), out.size());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], tol) << i;
  std::vector<double> ref_lse = ref.lse.to_f64(), lse = got.lse.to_f64();
  const int64_t T = z.local_rows();
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < T; ++i)
      ASSERT_NEAR(lse[h * T + i], ref_lse[h * Tg + z.global_rows[i]], tol) << h << "," << i;
}

// The layout by hand: cp 2, documents of 1 and 19 tokens padded to 4 and 20 (chunks of 1 and
// 5); rank 0 holds chunks 0 and 3 of each, rank 1 chunks 1 and 2.
TEST(ZigzagLayoutTest, ChunksPositionsAndPads) {
  ZigzagLayout z0 = zigzag_layout({1, 19}, 2, 0);
  EXPECT_EQ(z0.padded_lengths, (std::vector<int64_t>{4, 20}));
  EXPECT_EQ(z0.cu_seqlens_global, (std::vector<int32_t>{0, 4, 24}));
  EXPECT_EQ(z0.cu_seqlens_local, (std::vector<int32_t>{0, 2, 12}));
  EXPECT_EQ(z0.cu_seqlens_half, (std::vector<int32_t>{0, 1, 6}));
  EXPECT_EQ(z0.global_rows, (std::vector<int64_t>{0, 3, 4, 5, 6, 7, 8, 19, 20, 21, 22, 23}));
  EXPECT_EQ(z0.positions, (std::vector<int64_t>{0, 3, 0, 1, 2, 3, 4, 15, 16, 17, 18, 19}));
  EXPECT_EQ(z0.is_pad, (std::vector<uint8_t>{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}));
  ZigzagLayout z1 = zigzag_layout({1, 19}, 2, 1);
  EXPECT_EQ(z1.global_rows, (std::vector<int64_t>{1, 2, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}));
  EXPECT_EQ(z1.is_pad, (std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_THROW(zigzag_layout({4}, 2, 2), Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ZigzagRing, ::testing::Values(DType::kF32, DType::kF64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace leantune::kernels

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  leantune::CommOptions o;
  o.backend = "mpi";
  (void)leantune::world_communicator(o);
  const int rc = RUN_ALL_TESTS();
  leantune::shutdown_communicators();
  return rc;
}
