// bench_ring_attention: one training step of zigzag ring attention (forward + backward,
// kernels/ring_attention.h) on CPU ranks over the MPI Communicator, against the ideal: the
// single-process varlen attention forward + backward over the whole batch (kernels/attention.h),
// divided by cp.
//
//   mpirun -np CP bench_ring_attention [--tokens 4096] [--heads 8] [--kv_heads H]
//                                      [--head_dim 64] [--docs 1] [--iters 5] [--f64]
//
// --tokens is the global (padded) token count, split into --docs equal causal documents, each
// padded to a multiple of 2cp. The single-process time is measured on every rank at once (each
// runs the whole problem), so that it sees the same cores and memory bandwidth per rank as the
// ring run; with more ranks than cores both are oversubscribed alike. Rows (times in ms, mean
// over iterations after one warm-up, slowest rank):
//   single  fwd+bwd of the whole batch in one process;  ideal = single / cp
//   ring    fwd+bwd of the ring step (slowest rank), and its fwd and bwd parts (slowest rank
//           each);                                      % ideal = ideal / ring
//   comm    exposed communication: time spent inside Communicator calls (posting sends and
//           receives, and waiting for them at group_end), fwd + bwd, slowest rank and mean; the
//           transfers that finish while a step computes are hidden and not counted
//   busy    ring time minus comm per rank, least and most loaded rank (the zigzag balance)
// All times in ms.
// Exit codes: 0 ok, 1 internal error, 2 bad option.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/comm.h"
#include "kernels/ring_attention.h"

namespace {

using leantune::Communicator;
using leantune::DType;
using leantune::ReduceOp;
using leantune::Tensor;
using Clock = std::chrono::steady_clock;

// Forwards every call to `inner` and adds the time spent in it to `seconds`.
class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(Communicator& inner) : c_(inner) {}
  double seconds = 0;

  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  int local_rank() const override { return c_.local_rank(); }
  std::string backend_name() const override { return c_.backend_name(); }
  bool deterministic() const override { return c_.deterministic(); }
  double timeout_seconds() const override { return c_.timeout_seconds(); }
  void all_reduce(Tensor& x, ReduceOp op) override {
    timed([&] { c_.all_reduce(x, op); });
  }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    timed([&] { c_.reduce_scatter(in, out, op); });
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    timed([&] { c_.all_gather(in, out); });
  }
  void broadcast(Tensor& x, int root) override {
    timed([&] { c_.broadcast(x, root); });
  }
  void group_start() override {
    timed([&] { c_.group_start(); });
  }
  void group_end() override {
    timed([&] { c_.group_end(); });
  }
  void send(const Tensor& x, int peer) override {
    timed([&] { c_.send(x, peer); });
  }
  void recv(Tensor& x, int peer) override {
    timed([&] { c_.recv(x, peer); });
  }
  void barrier() override {
    timed([&] { c_.barrier(); });
  }
  double all_reduce_scalar(double v, ReduceOp op) override { return c_.all_reduce_scalar(v, op); }
  int64_t all_reduce_int(int64_t v, ReduceOp op) override { return c_.all_reduce_int(v, op); }
  std::vector<double> all_gather_scalar(double v) override { return c_.all_gather_scalar(v); }
  std::unique_ptr<Communicator> split(int color, int key) override { return c_.split(color, key); }
  std::unique_ptr<Communicator> duplicate(const leantune::CommOptions& o) override {
    return c_.duplicate(o);
  }

 private:
  template <typename F>
  void timed(F&& f) {
    const auto t0 = Clock::now();
    f();
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  Communicator& c_;
};

struct Flags {
  int64_t tokens = 4096, heads = 8, kv_heads = 0, head_dim = 64, docs = 1, iters = 5;
  bool f64 = false;
};

// Bad options are a one-line error and exit code 2.
Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--f64") {
      f.f64 = true;
      continue;
    }
    int64_t* dst = a == "--tokens"     ? &f.tokens
                   : a == "--heads"    ? &f.heads
                   : a == "--kv_heads" ? &f.kv_heads
                   : a == "--head_dim" ? &f.head_dim
                   : a == "--docs"     ? &f.docs
                   : a == "--iters"    ? &f.iters
                                       : nullptr;
    char* end = nullptr;
    if (dst == nullptr || i + 1 >= argc || (*dst = std::strtoll(argv[i + 1], &end, 10)) <= 0 ||
        *end != '\0') {
      std::fprintf(stderr, "bench_ring_attention: bad option %s%s%s\n", a.c_str(),
                   i + 1 < argc ? " " : "", i + 1 < argc ? argv[i + 1] : "");
      std::exit(2);
    }
    ++i;
  }
  if (f.kv_heads == 0) f.kv_heads = f.heads;
  if (f.heads % f.kv_heads != 0 || f.docs > f.tokens) {
    std::fprintf(stderr,
                 "bench_ring_attention: --heads %lld not a multiple of --kv_heads %lld, "
                 "or more --docs than --tokens\n",
                 static_cast<long long>(f.heads), static_cast<long long>(f.kv_heads));
    std::exit(2);
  }
  return f;
}

Tensor input(int64_t rows, int64_t heads, int64_t dim, double seed, DType dt) {
  std::vector<double> v(rows * heads * dim);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + seed);
  return Tensor::from_doubles(v, {rows, heads, dim}, dt);
}

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  using namespace leantune;
  using namespace leantune::kernels;
  const Flags f = parse(argc, argv);
  try {
    CommOptions o;
    o.backend = "mpi";
    Communicator& world = world_communicator(o);
    TimedCommunicator comm(world);
    const int cp = world.size(), r = world.rank();
    const DType dt = f.f64 ? DType::kF64 : DType::kF32;
    // --docs equal documents; the last takes the remainder.
    std::vector<int64_t> lengths(f.docs, f.tokens / f.docs);
    lengths.back() += f.tokens - f.tokens / f.docs * f.docs;
    const ZigzagLayout z = zigzag_layout(lengths, cp, r);
    const int64_t Tg = z.cu_seqlens_global.back();
    const Tensor q = input(Tg, f.heads, f.head_dim, 0.1, dt);
    const Tensor k = input(Tg, f.kv_heads, f.head_dim, 1.7, dt);
    const Tensor v = input(Tg, f.kv_heads, f.head_dim, 2.9, dt);
    const Tensor dout = input(Tg, f.heads, f.head_dim, 4.3, dt);
    const Tensor cu = Tensor::from_vector(z.cu_seqlens_global,
                                          {static_cast<int64_t>(z.cu_seqlens_global.size())});
    const Tensor ql = zigzag_local_rows(q, z), kl = zigzag_local_rows(k, z),
                 vl = zigzag_local_rows(v, z), gl = zigzag_local_rows(dout, z);

    // Single process, whole batch, on every rank at once.
    AttentionOptions opt;
    Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty({f.heads, Tg}, dt);
    Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt),
           dv = Tensor::empty(v.shape(), dt);
    double single = 0;
    for (int64_t it = 0; it <= f.iters; ++it) {
      world.barrier();
      const double t0 = now_s();
      attention_fwd(q, k, v, cu, cu, opt, out, lse);
      attention_bwd(dout, q, k, v, out, lse, cu, cu, opt, dq, dk, dv);
      if (it > 0) single += now_s() - t0;
    }
    single = world.all_reduce_scalar(single / f.iters, ReduceOp::kMax);

    double fwd = 0, bwd = 0, comm_s = 0;
    for (int64_t it = 0; it <= f.iters; ++it) {
      world.barrier();
      comm.seconds = 0;
      const double t0 = now_s();
      AttentionOutput res = zigzag_ring_attention_fwd(comm, ql, kl, vl, z);
      const double t1 = now_s();
      AttentionGrads g = zigzag_ring_attention_bwd(comm, ql, kl, vl, res.out, res.lse, gl, z);
      const double t2 = now_s();
      if (it == 0) continue;
      fwd += t1 - t0;
      bwd += t2 - t1;
      comm_s += comm.seconds;
    }
    fwd /= f.iters;
    bwd /= f.iters;
    comm_s /= f.iters;
    const double ring = world.all_reduce_scalar(fwd + bwd, ReduceOp::kMax);
    const double fwd_max = world.all_reduce_scalar(fwd, ReduceOp::kMax);
    const double bwd_max = world.all_reduce_scalar(bwd, ReduceOp::kMax);
    const double comm_max = world.all_reduce_scalar(comm_s, ReduceOp::kMax);
    const double comm_mean = world.all_reduce_scalar(comm_s, ReduceOp::kSum) / cp;
    // Time outside communicator calls: the zigzag split should make it equal across ranks.
    const double busy_min = world.all_reduce_scalar(fwd + bwd - comm_s, ReduceOp::kMin);
    const double busy_max = world.all_reduce_scalar(fwd + bwd - comm_s, ReduceOp::kMax);
    if (r == 0) {
      const double ideal = single / cp;
      const double kv_mb = 2.0 * kl.nbytes() / 1e6;
      std::printf(
          "# bench_ring_attention: cp %d, %lld tokens (%lld docs, %lld padded), heads "
          "%lld/%lld, head_dim %lld, %s, %lld iterations, OMP threads per rank from "
          "OMP_NUM_THREADS\n",
          cp, static_cast<long long>(f.tokens), static_cast<long long>(f.docs),
          static_cast<long long>(Tg), static_cast<long long>(f.heads),
          static_cast<long long>(f.kv_heads), static_cast<long long>(f.head_dim), dtype_name(dt),
          static_cast<long long>(f.iters));
      std::printf("%-3s %10s %9s %9s %9s %9s %7s %10s %10s %10s %10s %9s\n", "cp", "single_ms",
                  "ideal_ms", "ring_ms", "fwd_ms", "bwd_ms", "%ideal", "comm_max", "comm_mean",
                  "busy_min", "busy_max", "kv_MB/hop");
      std::printf("%-3d %10.2f %9.2f %9.2f %9.2f %9.2f %6.1f%% %10.2f %10.2f %10.2f %10.2f %9.2f\n",
                  cp, single * 1e3, ideal * 1e3, ring * 1e3, fwd_max * 1e3, bwd_max * 1e3,
                  100.0 * ideal / ring, comm_max * 1e3, comm_mean * 1e3, busy_min * 1e3,
                  busy_max * 1e3, kv_mb);
    }
    shutdown_communicators();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_ring_attention: %s\n", e.what());
    abort_communicators(1);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ring_attention: %s\n", e.what());
    abort_communicators(1);
    return 1;
  }
}
