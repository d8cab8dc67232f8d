// The thread ring and the zigzag problems of ring_test_util.h.
#include "kernels/ring_test_util.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "engine/check.h"
#include "engine/stream.h"
#include "testing/testing.h"

namespace leantune::ring_test {

namespace {

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

}  // namespace

void run_ring(int cp, const std::function<void(int, Communicator&)>& f) {
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

Global make_global(const RingCase& c, int cp, DType dt, uint64_t seed) {
  Global g;
  g.z0 = kernels::zigzag_layout(c.lengths, cp, 0);
  const int64_t tg = g.z0.cu_seqlens_global.back();
  g.q = testing::randn({tg, c.hq, c.d}, dt, seed);
  g.k = testing::randn({tg, c.hk, c.d}, dt, seed + 1);
  g.v = testing::randn({tg, c.hk, c.d}, dt, seed + 2);
  std::vector<double> dout = testing::randn({tg, c.hq, c.d}, dt, seed + 3).to_f64();
  for (size_t b = 0; b < c.lengths.size(); ++b)
    for (int64_t i = g.z0.cu_seqlens_global[b] + c.lengths[b]; i < g.z0.cu_seqlens_global[b + 1];
         ++i)
      std::fill(dout.begin() + i * c.hq * c.d, dout.begin() + (i + 1) * c.hq * c.d, 0.0);
  g.dout = Tensor::from_doubles(dout, {tg, c.hq, c.d}, dt);
  return g;
}

std::vector<RankResult> run_rings(const RingCase& c, const Global& g, int cp, Device dev,
                                  DType dt) {
  std::vector<RankResult> res(cp);
  run_ring(cp, [&](int r, Communicator& comm) {
    const kernels::ZigzagLayout z = kernels::zigzag_layout(c.lengths, cp, r);
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

std::vector<double> local_rows(const std::vector<double>& global, int64_t row,
                               const kernels::ZigzagLayout& z) {
  std::vector<double> out;
  out.reserve(z.local_rows() * row);
  for (int64_t gr : z.global_rows)
    out.insert(out.end(), global.begin() + gr * row, global.begin() + (gr + 1) * row);
  return out;
}

}  // namespace leantune::ring_test
