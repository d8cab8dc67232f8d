// The communicator factory and the single-process backend (engine/comm.h).
//
// Single process: world size 1, so every reduction is the identity (kAvg divides by 1), a
// reduce_scatter or all_gather is a copy, and send/recv to oneself go through a queue (a ring of
// one rank sends to itself). The world communicator is chosen once: MPI when the process was
// started by a launcher with more than one rank (or --comm_backend mpi), otherwise single;
// NCCL (CUDA tensors, one GPU per rank) when --comm_backend nccl asks for it.
#include "engine/comm.h"

#include <cstdlib>
#include <deque>
#include <mutex>

#include "engine/check.h"
#include "engine/comm_fold.h"
#include "engine/comm_mpi.h"
#include "engine/comm_nccl.h"
#include "engine/cuda_backend.h"
#include "engine/ops.h"

namespace leantune {
namespace {

void check_tensor(const Tensor& t, const char* what,
                  comm_detail::CommUse use = comm_detail::CommUse::kMove) {
  LT_CHECK(t.defined() && t.is_contiguous(), "comm ", what, ": tensor must be contiguous");
  comm_detail::check_comm_dtype(t.dtype(), what, use);
}

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(const CommOptions& o) : opt_(o) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::string backend_name() const override { return "single"; }
  bool deterministic() const override { return opt_.deterministic; }
  double timeout_seconds() const override { return opt_.timeout_seconds; }

  void all_reduce(Tensor& x, ReduceOp) override {
    check_tensor(x, "all_reduce", comm_detail::CommUse::kReduce);
  }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp) override {
    check_tensor(in, "reduce_scatter", comm_detail::CommUse::kReduce);
    check_tensor(out, "reduce_scatter", comm_detail::CommUse::kReduce);
    LT_CHECK(in.numel() == out.numel(), "reduce_scatter: in ", in.str(), " out ", out.str());
    if (out.data_ptr() != in.data_ptr()) out.copy_(in.view(out.shape()));
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    check_tensor(in, "all_gather");
    check_tensor(out, "all_gather");
    LT_CHECK(in.numel() == out.numel(), "all_gather: in ", in.str(), " out ", out.str());
    if (out.data_ptr() != in.data_ptr()) out.copy_(in.view(out.shape()));
  }
  void broadcast(Tensor& x, int root) override {
    check_tensor(x, "broadcast");
    LT_CHECK(root == 0, "broadcast: root ", root, " outside world of 1");
  }
  void group_start() override { ++group_depth_; }
  void group_end() override {
    LT_CHECK(group_depth_ > 0, "group_end without group_start");
    --group_depth_;
    if (group_depth_ == 0) flush();
  }
  void send(const Tensor& x, int peer) override {
    check_tensor(x, "send");
    LT_CHECK(peer == 0, "send: peer ", peer, " outside world of 1");
    sends_.push_back(x.clone(MemTag::kComm));
    if (group_depth_ == 0) flush();
  }
  void recv(Tensor& x, int peer) override {
    check_tensor(x, "recv");
    LT_CHECK(peer == 0, "recv: peer ", peer, " outside world of 1");
    recvs_.push_back(x);
    if (group_depth_ == 0) flush();
  }
  void barrier() override {}
  double all_reduce_scalar(double v, ReduceOp) override { return v; }
  int64_t all_reduce_int(int64_t v, ReduceOp op) override {
    LT_CHECK(op != ReduceOp::kAvg, "all_reduce_int: avg of an integer");
    return v;
  }
  std::vector<double> all_gather_scalar(double v) override { return {v}; }
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<SingleCommunicator>(opt_);
  }
  std::unique_ptr<Communicator> duplicate(const CommOptions& options) override {
    return std::make_unique<SingleCommunicator>(options);
  }

 private:
  // Matches sends to receives in order; outside a group a receive with no send yet would wait
  // forever, so it is an error instead.
  void flush() {
    while (!sends_.empty() && !recvs_.empty()) {
      Tensor& dst = recvs_.front();
      LT_CHECK(dst.nbytes() == sends_.front().nbytes(), "recv of ", dst.str(),
               " matched a send of ", sends_.front().str());
      dst.copy_(sends_.front().view(dst.shape()));
      sends_.pop_front();
      recvs_.pop_front();
    }
    LT_CHECK(recvs_.empty(), "recv from rank 0 with no matching send");
  }

  CommOptions opt_;
  int group_depth_ = 0;
  std::deque<Tensor> sends_;
  std::deque<Tensor> recvs_;
};

std::mutex g_world_mutex;
std::unique_ptr<Communicator> g_world;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}

// The MPI communicator make_mpi() returns, or with --comm_backend nccl the NCCL one bootstrapped
// over it. One process per GPU: the node-local rank picks the device (a launcher that pins one
// GPU per task leaves one visible device).
template <typename MakeMpi>
std::unique_ptr<Communicator> over_mpi(MakeMpi&& make_mpi, const CommOptions& options) {
  if (options.backend != "nccl") return make_mpi();
  LT_CHECK_INPUT(cuda_backend_device_count() > 0, "--comm_backend nccl: no CUDA device (",
                 cuda_backend_error().empty() ? "none visible" : cuda_backend_error(), ")");
  std::unique_ptr<Communicator> mpi = make_mpi();
  const int count = cuda_backend_device_count();
  const int device = count == 1 ? 0 : mpi->local_rank();
  LT_CHECK_INPUT(device < count, "--comm_backend nccl: node-local rank ", mpi->local_rank(),
                 " but only ", count, " CUDA devices on this node (one rank per GPU)");
  return comm_detail::make_nccl_communicator(std::move(mpi), device, options);
}

}  // namespace

std::unique_ptr<Communicator> make_communicator_from_mpi(int64_t mpi_fortran_handle,
                                                         const CommOptions& options) {
  const std::string& b = options.backend;
  LT_CHECK_INPUT(b == "auto" || b == "mpi" || b == "nccl", "comm_backend ", b,
                 ": an MPI communicator was given (expected auto, mpi or nccl)");
  LT_CHECK_INPUT(options.timeout_seconds > 0, "--comm_timeout ", options.timeout_seconds,
                 ": must be positive (seconds)");
  LT_CHECK_INPUT(comm_detail::mpi_available(),
                 "an MPI communicator was given, but this build of leantune has no MPI");
  return over_mpi([&] { return comm_detail::make_mpi_from_handle(mpi_fortran_handle, options); },
                  options);
}

bool launched_distributed() {
  for (const char* n : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"})
    if (env_int(n) > 1) return true;
  return false;
}

// Any order: the backend's own reduce_scatter into scratch, then one add. A backend whose
// deterministic() is true folds out's value in first and overrides this (a world of one has
// nothing to order: out + in_0 is the fold).
void Communicator::reduce_scatter_accumulate(const Tensor& in, Tensor& out) {
  LT_CHECK(!deterministic() || size() == 1, "reduce_scatter_accumulate: the ", backend_name(),
           " backend has no rank-order accumulation");
  LT_CHECK(out.defined() && out.is_contiguous(),
           "reduce_scatter_accumulate: out must be contiguous");
  Tensor sum = Tensor::empty(out.shape(), out.dtype(), out.device(), MemTag::kComm);
  reduce_scatter(in, sum, ReduceOp::kSum);
  ops::add_(out, sum);
}

namespace {
class CompletedCollective final : public PendingCollective {
 public:
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingCollective> Communicator::start_all_gather(const Tensor& in, Tensor& out) {
  all_gather(in, out);
  return std::make_unique<CompletedCollective>();
}

std::unique_ptr<Communicator> make_single_communicator(const CommOptions& options) {
  return std::make_unique<SingleCommunicator>(options);
}

Communicator& world_communicator(const CommOptions& options) {
  std::lock_guard<std::mutex> lock(g_world_mutex);
  if (g_world) return *g_world;
  const std::string& b = options.backend;
  LT_CHECK_INPUT(b == "auto" || b == "single" || b == "mpi" || b == "nccl", "--comm_backend ", b,
                 ": expected auto, single, mpi or nccl");
  LT_CHECK_INPUT(options.timeout_seconds > 0, "--comm_timeout ", options.timeout_seconds,
                 ": must be positive (seconds)");
  const bool want_mpi = b == "mpi" || b == "nccl" || (b == "auto" && launched_distributed());
  if (b == "single") {
    LT_CHECK_INPUT(!launched_distributed(),
                   "--comm_backend single, but this process is one of several ranks started by a "
                   "launcher (mpirun/srun)");
  }
  if (want_mpi) {
    LT_CHECK_INPUT(comm_detail::mpi_available(), "--comm_backend ", b,
                   ": this build of leantune has no MPI (install libopenmpi-dev and rebuild)");
    g_world = over_mpi([&] { return comm_detail::make_mpi_world(options); }, options);
  } else {
    g_world = make_single_communicator(options);
  }
  return *g_world;
}

bool world_communicator_started() {
  std::lock_guard<std::mutex> lock(g_world_mutex);
  return g_world != nullptr;
}

void abort_communicators(int exit_code) {
  if (comm_detail::mpi_available()) comm_detail::mpi_abort_if_initialized(exit_code);
}

void shutdown_communicators() {
  std::lock_guard<std::mutex> lock(g_world_mutex);
  g_world.reset();
  if (comm_detail::mpi_available()) comm_detail::mpi_finalize_if_initialized();
}

}  // namespace leantune
