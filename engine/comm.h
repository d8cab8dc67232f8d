// Communicator: the one interface every distributed feature (data parallel, ZeRO 1/2/3, ring
// attention) talks to. leantune has no transport of its own: the backends are
//   - single process (world 1; every collective is a copy or a no-op),
//   - MPI, for CPU tensors (Open MPI; bf16/f16 travel as 16-bit words and are reduced in f32),
//   - NCCL, for CUDA tensors, bootstrapped through MPI (rank 0's unique id is broadcast,
//     cudaSetDevice by node-local rank) and run on the communicator's own stream, ordered
//     against the caller's current stream with events.
// Every collective is issued by every rank of the communicator in the same order (as MPI and
// NCCL demand). Tensors are contiguous; shapes are [numel] views unless said otherwise.
//
// Determinism: with deterministic() true, sums fold the ranks' contributions in rank order
// (0 + 1 + 2 ...) in f32 (f64 for f64), so the result does not depend on the world size or on
// how a reduction was split (all_reduce vs reduce_scatter + all_gather) beyond that order.
//
// Failure: a dead or stuck peer becomes a leantune::Error on every live rank within
// timeout_seconds() ("rank R lost: ..." naming the peer when it is known); no call blocks
// forever. The watchdog aborts the job's communicators (MPI_Abort / ncclCommAbort) when a
// blocked call cannot be interrupted, so the exit is non-zero everywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace leantune {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };

// A collective started and not waited for yet (Communicator::start_all_gather).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Completes it: on the host, blocks until the data are in; NCCL orders the caller's current
  // stream after it. A lost peer or the timeout (counted from this call) throws here.
  virtual void wait() = 0;
  // Lets it advance without blocking (MPI moves a started collective only inside MPI calls).
  virtual void poll() {}
};

struct CommOptions {
  std::string backend = "auto";  // auto | single | mpi | nccl (auto: mpi under a launcher)
  bool deterministic = false;    // --deterministic_comm
  double timeout_seconds = 600;  // --comm_timeout
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank among the processes of this node (selects the CUDA device).
  virtual int local_rank() const = 0;
  virtual std::string backend_name() const = 0;  // "single", "mpi", "nccl"
  virtual bool deterministic() const = 0;
  virtual double timeout_seconds() const = 0;

  // In place: x becomes op over all ranks' x.
  virtual void all_reduce(Tensor& x, ReduceOp op = ReduceOp::kSum) = 0;
  // all_reduce whose result the caller does not read at once: `then` (the code that consumes x)
  // runs after the sum in stream order. The NCCL backend enqueues both on its own stream and
  // does not make the caller's stream wait, so kernels the caller queues meanwhile (the rest of
  // backward) overlap the reduction; wait_deferred() orders the caller's stream after every such
  // call since the last one. Host backends sum, run `then` and return.
  virtual void all_reduce_then(Tensor& x, ReduceOp op, const std::function<void()>& then) {
    all_reduce(x, op);
    then();
  }
  // The same for reduce_scatter (ZeRO-2's units): out holds this rank's block once
  // wait_deferred() has ordered the caller's stream.
  virtual void reduce_scatter_then(const Tensor& in, Tensor& out, ReduceOp op,
                                   const std::function<void()>& then) {
    reduce_scatter(in, out, op);
    then();
  }
  virtual void wait_deferred() {}
  // in:[size()*n] -> out:[n], rank r keeps block r of the reduction.
  virtual void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::kSum) = 0;
  // in:[size()*n] -> out:[n], kSum only: out += the sum over the ranks of block rank(). Under
  // deterministic(), out's old value is the first term of the rank-order fold,
  //   out = ((out + in_0) + in_1) + ... + in_{N-1}   (f32 accumulation, as every fold),
  // so that gradients summed over the ranks one micro-batch at a time associate exactly as one
  // process's accumulation over the same micro-batches in global order. Otherwise any order.
  virtual void reduce_scatter_accumulate(const Tensor& in, Tensor& out);
  // in:[n] -> out:[size()*n], block r is rank r's input.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // all_gather that runs while the caller goes on, completed by the handle's wait() (ZeRO-3's
  // prefetch of the next unit). in and out stay alive and unchanged until then; other
  // collectives may be issued meanwhile (every rank in the same order, as always). The handle
  // is waited for at the latest by its destructor. Default: done before it returns.
  virtual std::unique_ptr<PendingCollective> start_all_gather(const Tensor& in, Tensor& out);
  virtual void broadcast(Tensor& x, int root) = 0;
  // Point-to-point in a group: every send and recv between group_start() and group_end() may
  // progress concurrently (NCCL group semantics; MPI uses nonblocking calls completed at
  // group_end). Outside a group each call completes before it returns.
  virtual void group_start() = 0;
  virtual void group_end() = 0;
  virtual void send(const Tensor& x, int peer) = 0;
  virtual void recv(Tensor& x, int peer) = 0;
  virtual void barrier() = 0;

  // Host scalars (loss sums, token counts, grad norms), always deterministic (rank order).
  virtual double all_reduce_scalar(double v, ReduceOp op = ReduceOp::kSum) = 0;
  virtual int64_t all_reduce_int(int64_t v, ReduceOp op = ReduceOp::kSum) = 0;
  virtual std::vector<double> all_gather_scalar(double v) = 0;

  // Sub-communicator of the ranks with the same color, ordered by (key, rank), with this one's
  // options. Collective.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // A communicator over the same ranks with other options (determinism, timeout), or a second
  // one so that two streams of traffic (all-gather and reduce-scatter) do not serialise.
  // Collective.
  virtual std::unique_ptr<Communicator> duplicate(const CommOptions& options) = 0;
};

// The world communicator of this process: MPI is initialised on first use when the process was
// started by mpirun/srun (or LEANTUNE_BACKEND asks for it); otherwise the single-process one.
// Options apply to the first call; later calls return the same object.
Communicator& world_communicator(const CommOptions& options = {});
// The communicator of an embedder (public API): its MPI_Comm, given as the Fortran handle
// MPI_Comm_c2f returns (so that no caller of this header needs mpi.h), duplicated (MPI_Comm_dup)
// so that leantune's traffic never mixes with the caller's. options.backend: auto or mpi (CPU
// tensors), nccl (one GPU per rank, bootstrapped over it); single is refused. Collective over the
// given communicator; MPI stays the caller's to initialise and finalise.
std::unique_ptr<Communicator> make_communicator_from_mpi(int64_t mpi_fortran_handle,
                                                         const CommOptions& options);
// True when this process runs under a launcher with more than one rank.
bool launched_distributed();
// Whether world_communicator() has been created in this process.
bool world_communicator_started();
// Ends every rank of the job (MPI_Abort) after an error on this one, so that peers waiting in a
// collective stop at once instead of at their timeout. Returns when MPI is not running.
void abort_communicators(int exit_code);
// Finalises MPI/NCCL (at exit of trainer_bin; safe to call when nothing was initialised).
void shutdown_communicators();

// A fresh single-process communicator (tests, and world_size 1 runs).
std::unique_ptr<Communicator> make_single_communicator(const CommOptions& options = {});

}  // namespace leantune
