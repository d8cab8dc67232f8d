// GPU tier for zigzag ring attention on CUDA (kernels/ring_attention.{cpp,cu}): the CUDA ring's
// forward and backward against the CPU ring on fresh random inputs, at cp 1 and 2.
// The ranks of a ring are threads of this process over a test communicator (ThreadRing) that
// moves tensors between them at group_end, so cp 2 runs on one GPU (NCCL refuses two ranks on one
// device); the driver, the block schedule and the ring_*_cuda kernels are what run on CUDA.
//   f32:  CUDA ring vs CPU ring in f32, within 2e-5 x max(1, max|ref|) (the attention's own f32
//         parity) for out, lse, dq, dk, dv.
//   bf16: ref = the CPU ring in f64 on the same bf16 inputs; flash-attention's rule (hopper/
//         test_flash_attn.py): max|ours - ref| <= 2 max|naive - ref| + 1e-4 max|ref|, with naive
//         the whole padded batch computed in bf16 the way PyTorch runs it (scores, softmax, P V
//         and every backward product rounded to bf16), read at the rank's rows; lse within the
//         bf16 row of the tolerance table (testing::tol).
// Cases: documents of length 1, odd lengths, an empty document, GQA 4 (Hq 8, Hk 2), head_dim 64
// (the tensor-core kernels for bf16). Pad rows (dout 0) must get exactly zero dQ/dK/dV.
// Without a device every Cuda test skips; RingAttentionThreads checks the thread ring itself on
// the CPU (cp 2 over threads equals single-process attention), so the harness is tested here.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/check.h"
#include "engine/comm.h"
#include "engine/dtype.h"
#include "engine/stream.h"
#include "kernel_test_util.h"
#include "kernels/ring_attention.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using Vec = std::vector<double>;
using kernel_test::flash_rule;
using kernel_test::max_abs_finite;
using kernel_test::max_err;
using kernels::ZigzagLayout;
const Device kGpu = Device::cuda(0);

// ---------------------------------------------------------------- the thread ring

// Mailboxes between the ranks (threads) of one ring: (from, to) -> tensors in send order.
struct RingHub {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<Tensor>> box;
};

// Point-to-point only. Sends and receives inside a group are queued and done at group_end: every
// send first (a private copy, taken after this rank's stream has finished writing it), then every
// receive (waits for the peer's copy, copies it in and waits for that copy). Outside a group each
// call runs alone. The collectives are not needed by the ring and throw.
class ThreadRing final : public Communicator {
 public:
  ThreadRing(std::shared_ptr<RingHub> hub, int rank, int size)
      : hub_(std::move(hub)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return 0; }
  std::string backend_name() const override { return "threads"; }
  bool deterministic() const override { return true; }
  double timeout_seconds() const override { return 120; }
  void all_reduce(Tensor&, ReduceOp) override { unsupported("all_reduce"); }
  void reduce_scatter(const Tensor&, Tensor&, ReduceOp) override { unsupported("reduce_scatter"); }
  void all_gather(const Tensor&, Tensor&) override { unsupported("all_gather"); }
  void broadcast(Tensor&, int) override { unsupported("broadcast"); }
  void barrier() override { unsupported("barrier"); }
  double all_reduce_scalar(double, ReduceOp) override {
    unsupported("all_reduce_scalar");
    return 0;
  }
  int64_t all_reduce_int(int64_t, ReduceOp) override {
    unsupported("all_reduce_int");
    return 0;
  }
  std::vector<double> all_gather_scalar(double) override {
    unsupported("all_gather_scalar");
    return {};
  }
  std::unique_ptr<Communicator> split(int, int) override {
    unsupported("split");
    return nullptr;
  }
  std::unique_ptr<Communicator> duplicate(const CommOptions&) override {
    unsupported("duplicate");
    return nullptr;
  }

  void group_start() override { ++depth_; }
  void group_end() override {
    LT_CHECK(depth_ > 0, "ThreadRing: group_end without group_start");
    if (--depth_ > 0) return;
    for (auto& [t, peer] : sends_) post(t, peer);
    for (auto& [t, peer] : recvs_) take(t, peer);
    sends_.clear();
    recvs_.clear();
  }
  void send(const Tensor& x, int peer) override {
    if (depth_ > 0)
      sends_.emplace_back(x, peer);
    else
      post(x, peer);
  }
  void recv(Tensor& x, int peer) override {
    if (depth_ > 0)
      recvs_.emplace_back(x, peer);
    else
      take(x, peer);
  }

 private:
  static void unsupported(const char* what) {
    LT_THROW(ErrorKind::kInternal, "ThreadRing: ", what, " is not part of the test ring");
  }
  static void sync(const Tensor& t) {
    if (t.device().is_cuda()) current_stream(t.device()).synchronize();
  }
  void post(const Tensor& x, int peer) {
    Tensor copy = x.clone(MemTag::kComm);
    sync(copy);
    std::lock_guard<std::mutex> lock(hub_->mu);
    hub_->box[{rank_, peer}].push_back(copy);
    hub_->cv.notify_all();
  }
  void take(Tensor& x, int peer) {
    Tensor got;
    {
      std::unique_lock<std::mutex> lock(hub_->mu);
      auto& q = hub_->box[{peer, rank_}];
      const bool ok =
          hub_->cv.wait_for(lock, std::chrono::seconds(120), [&] { return !q.empty(); });
      LT_CHECK(ok, "ThreadRing: rank ", rank_, " waited 120 s for rank ", peer);
      got = q.front();
      q.pop_front();
    }
    LT_CHECK(got.shape() == x.shape() && got.dtype() == x.dtype(), "ThreadRing: received ",
             got.str(), " into ", x.str());
    x.copy_(got);
    sync(x);  // `got` may be freed (and reused by its sender's stream) once this returns
  }

  std::shared_ptr<RingHub> hub_;
  int rank_, size_;
  int depth_ = 0;
  std::vector<std::pair<Tensor, int>> sends_, recvs_;
};

// Runs f(rank, comm) on cp threads, one per rank; rethrows the first rank's error.
template <typename F>
void run_ring(int cp, F&& f) {
  auto hub = std::make_shared<RingHub>();
  std::vector<std::exception_ptr> errors(cp);
  std::vector<std::thread> threads;
  for (int r = 0; r < cp; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadRing comm(hub, r, cp);
        f(r, comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// ---------------------------------------------------------------- problems and references

struct Case {
  const char* name;
  std::vector<int64_t> lengths;
  int64_t hq, hk, d;
};

// Length-1, odd-length and empty documents, GQA 4; the second adds documents longer than one
// attention tile.
const Case kCases[] = {
    {"Short", {1, 7, 0, 33, 18}, 8, 2, 64},
    {"Tiles", {1, 127, 3, 200}, 8, 2, 64},
};

// The padded global problem (CPU, dtype dt); dout is zero on pad rows, as the loss masks them.
struct Global {
  ZigzagLayout z0;  // rank 0's layout, for the global cu_seqlens
  Tensor q, k, v, dout;
};

Global make_global(const Case& c, int cp, DType dt, uint64_t seed) {
  Global g;
  g.z0 = kernels::zigzag_layout(c.lengths, cp, 0);
  const int64_t tg = g.z0.cu_seqlens_global.back();
  g.q = testing::randn({tg, c.hq, c.d}, dt, seed);
  g.k = testing::randn({tg, c.hk, c.d}, dt, seed + 1);
  g.v = testing::randn({tg, c.hk, c.d}, dt, seed + 2);
  Vec dout = testing::randn({tg, c.hq, c.d}, dt, seed + 3).to_f64();
  for (size_t b = 0; b < c.lengths.size(); ++b)
    for (int64_t i = g.z0.cu_seqlens_global[b] + c.lengths[b]; i < g.z0.cu_seqlens_global[b + 1];
         ++i)
      std::fill(dout.begin() + i * c.hq * c.d, dout.begin() + (i + 1) * c.hq * c.d, 0.0);
  g.dout = Tensor::from_doubles(dout, {tg, c.hq, c.d}, dt);
  return g;
}

// One rank's results, on the host.
struct RankResult {
  Tensor out, lse, dq, dk, dv;
};

// The ring forward and backward of every rank on `dev` in dtype `dt` (inputs converted).
std::vector<RankResult> run_rings(const Case& c, const Global& g, int cp, Device dev, DType dt) {
  std::vector<RankResult> res(cp);
  run_ring(cp, [&](int r, Communicator& comm) {
    const ZigzagLayout z = kernels::zigzag_layout(c.lengths, cp, r);
    auto local = [&](const Tensor& t) {
      return kernels::zigzag_local_rows(t, z).to(dev, dt, MemTag::kOther);
    };
    const Tensor q = local(g.q), k = local(g.k), v = local(g.v), dout = local(g.dout);
    kernels::AttentionOutput o = kernels::zigzag_ring_attention_fwd(comm, q, k, v, z);
    kernels::AttentionGrads gr =
        kernels::zigzag_ring_attention_bwd(comm, q, k, v, o.out, o.lse, dout, z);
    res[r] = {o.out.to(Device::cpu()), o.lse.to(Device::cpu()), gr.dq.to(Device::cpu()),
              gr.dk.to(Device::cpu()), gr.dv.to(Device::cpu())};
  });
  return res;
}

double round_to(double x, DType dt) {
  if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(static_cast<float>(x)));
  return static_cast<float>(x);
}

// The whole padded batch in dtype dt as PyTorch runs it (flash-attention's attention_ref without
// upcast): qs = r(q scale); S = r(qs K^T) causal; A = r(softmax(S)); O = r(A V); backward
// dA = r(dO V^T), dS = r(A (dA - rowsum(dA A))), dq = r(r(dS K) scale), dK_h = r(dS^T qs),
// dV_h = r(A^T dO), dK/dV = r(sum over the GQA group). Global [Tg, ...] host vectors.
struct Naive {
  Vec out, dq, dk, dv;
};

Naive naive_global(const Case& c, const Global& g, DType dt) {
  auto r = [dt](double x) { return round_to(x, dt); };
  const Vec q = g.q.to_f64(), k = g.k.to_f64(), v = g.v.to_f64(), go = g.dout.to_f64();
  const int64_t d = c.d, hq = c.hq, hk = c.hk, group = hq / hk;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Naive n;
  n.out.assign(q.size(), 0.0);
  n.dq.assign(q.size(), 0.0);
  Vec dk_sum(k.size(), 0.0), dv_sum(v.size(), 0.0);
  const std::vector<int32_t>& cu = g.z0.cu_seqlens_global;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t t0 = cu[b], len = cu[b + 1] - t0;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group;
      auto at = [&](const Vec& x, int64_t heads, int64_t head, int64_t i, int64_t e) {
        return x[((t0 + i) * heads + head) * d + e];
      };
      Vec qs(len * d), a(len * len, 0.0), ds(len * len, 0.0);
      for (int64_t i = 0; i < len; ++i)
        for (int64_t e = 0; e < d; ++e) qs[i * d + e] = r(at(q, hq, h, i, e) * scale);
      for (int64_t i = 0; i < len; ++i) {
        Vec s(i + 1);
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d; ++e) acc += qs[i * d + e] * at(k, hk, kh, j, e);
          s[j] = r(acc);
          m = std::max(m, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
        for (int64_t j = 0; j <= i; ++j) a[i * len + j] = r(std::exp(s[j] - m) / sum);
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += a[i * len + j] * at(v, hk, kh, j, e);
          n.out[((t0 + i) * hq + h) * d + e] = r(acc);
        }
        Vec da(i + 1);
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d; ++e) acc += at(go, hq, h, i, e) * at(v, hk, kh, j, e);
          da[j] = r(acc);
          dot += da[j] * a[i * len + j];
        }
        for (int64_t j = 0; j <= i; ++j) ds[i * len + j] = r(a[i * len + j] * (da[j] - dot));
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += ds[i * len + j] * at(k, hk, kh, j, e);
          n.dq[((t0 + i) * hq + h) * d + e] = r(r(acc) * scale);
        }
      }
      for (int64_t j = 0; j < len; ++j)
        for (int64_t e = 0; e < d; ++e) {
          double acck = 0, accv = 0;
          for (int64_t i = j; i < len; ++i) {
            acck += ds[i * len + j] * qs[i * d + e];
            accv += a[i * len + j] * at(go, hq, h, i, e);
          }
          dk_sum[((t0 + j) * hk + kh) * d + e] += r(acck);
          dv_sum[((t0 + j) * hk + kh) * d + e] += r(accv);
        }
    }
  }
  n.dk.resize(k.size());
  n.dv.resize(v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    n.dk[i] = r(dk_sum[i]);
    n.dv[i] = r(dv_sum[i]);
  }
  return n;
}

// A rank's rows of a global [Tg, ...] host vector whose rows hold `row` values.
Vec local_rows(const Vec& global, int64_t row, const ZigzagLayout& z) {
  Vec out;
  out.reserve(z.local_rows() * row);
  for (int64_t gr : z.global_rows)
    out.insert(out.end(), global.begin() + gr * row, global.begin() + (gr + 1) * row);
  return out;
}

::testing::AssertionResult within(const char* what, const Vec& ours, const Vec& ref, double tol) {
  const double e = max_err(ours, ref), bound = tol * std::max(1.0, max_abs_finite(ref));
  if (e <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max error " << e << " > " << bound;
}

// Pad rows of a local [T, H, D] gradient are exactly zero.
void expect_zero_pads(const Tensor& g, const ZigzagLayout& z, const char* what) {
  const Vec a = g.to_f64();
  const int64_t row = g.numel() / std::max<int64_t>(g.size(0), 1);
  for (int64_t i = 0; i < z.local_rows(); ++i) {
    if (!z.is_pad[i]) continue;
    for (int64_t e = 0; e < row; ++e) ASSERT_EQ(a[i * row + e], 0.0) << what << " row " << i;
  }
}

// ---------------------------------------------------------------- tests

class RingAttentionCuda : public ::testing::TestWithParam<std::tuple<int, int, DType>> {};

TEST_P(RingAttentionCuda, MatchesCpuRing) {
  LT_SKIP_WITHOUT_CUDA();
  const Case& c = kCases[std::get<0>(GetParam())];
  const int cp = std::get<1>(GetParam());
  const DType dt = std::get<2>(GetParam());
  const Global g = make_global(c, cp, dt, 7000 + 10 * cp + std::get<0>(GetParam()));
  const bool f32 = dt == DType::kF32;
  const std::vector<RankResult> ours = run_rings(c, g, cp, kGpu, dt);
  const std::vector<RankResult> ref = run_rings(c, g, cp, Device::cpu(), f32 ? dt : DType::kF64);
  Naive naive;
  if (!f32) naive = naive_global(c, g, dt);
  for (int r = 0; r < cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const ZigzagLayout z = kernels::zigzag_layout(c.lengths, cp, r);
    const RankResult& a = ours[r];
    const RankResult& b = ref[r];
    ASSERT_EQ(a.out.dtype(), dt);
    ASSERT_EQ(a.dq.dtype(), dt);
    ASSERT_EQ(a.dk.dtype(), dt);
    ASSERT_EQ(a.lse.dtype(), DType::kF32);
    const Vec lse = a.lse.to_f64(), rlse = b.lse.to_f64();
    if (f32) {
      EXPECT_TRUE(within("lse", lse, rlse, 2e-5));
      EXPECT_TRUE(within("out", a.out.to_f64(), b.out.to_f64(), 2e-5));
      EXPECT_TRUE(within("dq", a.dq.to_f64(), b.dq.to_f64(), 2e-5));
      EXPECT_TRUE(within("dk", a.dk.to_f64(), b.dk.to_f64(), 2e-5));
      EXPECT_TRUE(within("dv", a.dv.to_f64(), b.dv.to_f64(), 2e-5));
    } else {
      const testing::Tol t = testing::tol(dt);
      EXPECT_TRUE(testing::all_close(a.lse.to(DType::kF64), b.lse, t)) << "lse";
      const int64_t rq = c.hq * c.d, rk = c.hk * c.d;
      EXPECT_TRUE(flash_rule("out", a.out.to_f64(), local_rows(naive.out, rq, z), b.out.to_f64()));
      EXPECT_TRUE(flash_rule("dq", a.dq.to_f64(), local_rows(naive.dq, rq, z), b.dq.to_f64()));
      EXPECT_TRUE(flash_rule("dk", a.dk.to_f64(), local_rows(naive.dk, rk, z), b.dk.to_f64()));
      EXPECT_TRUE(flash_rule("dv", a.dv.to_f64(), local_rows(naive.dv, rk, z), b.dv.to_f64()));
    }
    expect_zero_pads(a.dq, z, "dq");
    expect_zero_pads(a.dk, z, "dk");
    expect_zero_pads(a.dv, z, "dv");
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, RingAttentionCuda,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Values(1, 2),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::string(kCases[std::get<0>(info.param)].name) + "_cp" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  dtype_name(std::get<2>(info.param));
                         });

// The CUDA ring refuses the MPI communicator (it moves host tensors) before any message.
TEST(RingAttentionCudaErrors, CudaTensorsOverMpiAreRefused) {
  LT_SKIP_WITHOUT_CUDA();
  const Case& c = kCases[0];
  const ZigzagLayout z = kernels::zigzag_layout(c.lengths, 2, 0);
  const Tensor q = Tensor::zeros({z.local_rows(), c.hq, c.d}, DType::kF32, kGpu);
  const Tensor kv = Tensor::zeros({z.local_rows(), c.hk, c.d}, DType::kF32, kGpu);
  struct MpiNamed final : Communicator {
    int rank() const override { return 0; }
    int size() const override { return 2; }
    int local_rank() const override { return 0; }
    std::string backend_name() const override { return "mpi"; }
    bool deterministic() const override { return true; }
    double timeout_seconds() const override { return 1; }
    void all_reduce(Tensor&, ReduceOp) override {}
    void reduce_scatter(const Tensor&, Tensor&, ReduceOp) override {}
    void all_gather(const Tensor&, Tensor&) override {}
    void broadcast(Tensor&, int) override {}
    void group_start() override { ADD_FAILURE() << "a message was posted"; }
    void group_end() override {}
    void send(const Tensor&, int) override {}
    void recv(Tensor&, int) override {}
    void barrier() override {}
    double all_reduce_scalar(double v, ReduceOp) override { return v; }
    int64_t all_reduce_int(int64_t v, ReduceOp) override { return v; }
    std::vector<double> all_gather_scalar(double v) override { return {v}; }
    std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
    std::unique_ptr<Communicator> duplicate(const CommOptions&) override { return nullptr; }
  } mpi;
  EXPECT_THROW(kernels::zigzag_ring_attention_fwd(mpi, q, kv, kv, z), Error);
}

// The harness on the CPU (runs without a device): cp 2 over ThreadRing equals single-process
// causal attention over the padded batch at the rank's rows, and bf16 on the CPU is refused.
TEST(RingAttentionThreads, CpuRingOverThreadsMatchesSingleProcess) {
  const Case& c = kCases[0];
  const int cp = 2;
  const Global g = make_global(c, cp, DType::kF64, 99);
  const std::vector<RankResult> ring = run_rings(c, g, cp, Device::cpu(), DType::kF64);
  const std::vector<int32_t>& cuv = g.z0.cu_seqlens_global;
  const Tensor cu = Tensor::from_vector(cuv, {static_cast<int64_t>(cuv.size())});
  kernels::AttentionOptions opt;
  Tensor out = Tensor::empty(g.q.shape(), DType::kF64),
         lse = Tensor::empty({c.hq, g.q.size(0)}, DType::kF64);
  kernels::attention_fwd(g.q, g.k, g.v, cu, cu, opt, out, lse);
  Tensor dq = Tensor::empty(g.q.shape(), DType::kF64), dk = Tensor::empty(g.k.shape(), DType::kF64),
         dv = Tensor::empty(g.v.shape(), DType::kF64);
  kernels::attention_bwd(g.dout, g.q, g.k, g.v, out, lse, cu, cu, opt, dq, dk, dv);
  const int64_t rq = c.hq * c.d, rk = c.hk * c.d;
  for (int r = 0; r < cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const ZigzagLayout z = kernels::zigzag_layout(c.lengths, cp, r);
    EXPECT_TRUE(within("out", ring[r].out.to_f64(), local_rows(out.to_f64(), rq, z), 1e-12));
    EXPECT_TRUE(within("dq", ring[r].dq.to_f64(), local_rows(dq.to_f64(), rq, z), 1e-12));
    EXPECT_TRUE(within("dk", ring[r].dk.to_f64(), local_rows(dk.to_f64(), rk, z), 1e-12));
    EXPECT_TRUE(within("dv", ring[r].dv.to_f64(), local_rows(dv.to_f64(), rk, z), 1e-12));
  }
  EXPECT_THROW(run_rings(c, g, cp, Device::cpu(), DType::kBF16), Error);
}

}  // namespace
}  // namespace leantune
