// bench_comm: bus bandwidth of the Communicator's collectives over message sizes, per backend,
// beside the raw MPI call each one replaces (the MPI library's own figure).
//
//   mpirun -np N bench_comm [--min_bytes 1024] [--max_bytes 67108864] [--iters 20]
//
// Figures follow nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time, where bytes is the
// size of the full buffer (all_reduce: the tensor; reduce_scatter: the input; all_gather: the
// output), and busbw = algbw * 2(N-1)/N for all_reduce and algbw * (N-1)/N for reduce_scatter and
// all_gather, the bandwidth each link must sustain; time is the slowest rank's mean over iters
// after 3 warm-up calls. Rows: "mpi" = the Communicator's MPI backend as the trainer uses it
// (library reductions), "mpi-det" = with --deterministic_comm (rank-order folds), "raw" = the
// blocking MPI call on the same buffer. The NCCL backend (CUDA tensors) needs a GPU build and
// devices; without them it is not listed.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/comm.h"
#include "engine/tensor.h"

namespace {

using leantune::Communicator;
using leantune::DType;
using leantune::Tensor;

template <typename F>
double seconds_per_call(Communicator& comm, int iters, F&& f) {
  for (int i = 0; i < 3; ++i) f();
  comm.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  const double local =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  return comm.all_reduce_scalar(local, leantune::ReduceOp::kMax);
}

int64_t arg(int argc, char** argv, const char* name, int64_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    leantune::CommOptions lib_opt;
    lib_opt.backend = "mpi";
    Communicator& world = leantune::world_communicator(lib_opt);
    leantune::CommOptions det_opt = lib_opt;
    det_opt.deterministic = true;
    auto det = world.duplicate(det_opt);
    const int n = world.size();
    const int64_t min_bytes = arg(argc, argv, "--min_bytes", 1024);
    const int64_t max_bytes = arg(argc, argv, "--max_bytes", int64_t{64} << 20);
    const int iters = static_cast<int>(arg(argc, argv, "--iters", 20));
    const double ar_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
    const double rs_factor = n > 1 ? static_cast<double>(n - 1) / n : 0.0;
    if (world.rank() == 0) {
      std::printf("# bench_comm: %d ranks, f32, %d iterations per size\n", n, iters);
      std::printf("%-14s %-8s %12s %12s %12s %12s\n", "collective", "backend", "bytes", "time_us",
                  "algbw_GB/s", "busbw_GB/s");
    }
    auto row = [&](const char* coll, const char* backend, int64_t bytes, double t, double f) {
      if (world.rank() != 0) return;
      const double algbw = bytes / t / 1e9;
      std::printf("%-14s %-8s %12lld %12.1f %12.3f %12.3f\n", coll, backend,
                  static_cast<long long>(bytes), t * 1e6, algbw, algbw * f);
    };
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      const int64_t elems = std::max<int64_t>(n, bytes / 4 / n * n);
      const int64_t b = elems * 4;
      Tensor x = Tensor::full({elems}, 1.0, DType::kF32);
      Tensor shard = Tensor::empty({elems / n}, DType::kF32);
      std::vector<float> raw_in(elems, 1.0f), raw_out(elems);
      for (auto* c : {&world, det.get()}) {
        const char* name = c == &world ? "mpi" : "mpi-det";
        row("all_reduce", name, b, seconds_per_call(world, iters, [&] { c->all_reduce(x); }),
            ar_factor);
        row("reduce_scatter", name, b,
            seconds_per_call(world, iters, [&] { c->reduce_scatter(x, shard); }), rs_factor);
        row("all_gather", name, b, seconds_per_call(world, iters, [&] { c->all_gather(shard, x); }),
            rs_factor);
      }
      const int cnt = static_cast<int>(elems), part = static_cast<int>(elems / n);
      row("all_reduce", "raw", b,
          seconds_per_call(world, iters,
                           [&] {
                             MPI_Allreduce(MPI_IN_PLACE, raw_in.data(), cnt, MPI_FLOAT, MPI_SUM,
                                           MPI_COMM_WORLD);
                           }),
          ar_factor);
      row("reduce_scatter", "raw", b,
          seconds_per_call(world, iters,
                           [&] {
                             MPI_Reduce_scatter_block(raw_in.data(), raw_out.data(), part,
                                                      MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                           }),
          rs_factor);
      row("all_gather", "raw", b,
          seconds_per_call(world, iters,
                           [&] {
                             MPI_Allgather(raw_in.data(), part, MPI_FLOAT, raw_out.data(), part,
                                           MPI_FLOAT, MPI_COMM_WORLD);
                           }),
          rs_factor);
    }
    det.reset();
    leantune::shutdown_communicators();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm: %s\n", e.what());
    leantune::abort_communicators(1);
    return 1;
  }
}
