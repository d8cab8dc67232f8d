// The MPI backend of the Communicator (engine/comm.h), for CPU tensors.
//
// Every call is nonblocking underneath (MPI_I*) and completed by polling MPI_Testall against
// the deadline timeout_seconds() after the call began, so a dead or stuck peer becomes a
// leantune::Error (kind kComm) instead of a hang. On a timeout the rank asks every peer, on a
// separate heartbeat communicator, whether it is alive; peers that do not answer within a grace
// period are named as lost. trainer_bin then calls abort_communicators(), which ends the job.
//
// Reductions:
//   - f32/f64/i32/i64, not deterministic: MPI's own reduction (MPI_Iallreduce,
//     MPI_Ireduce_scatter_block), whatever its tree.
//   - deterministic, and always for bf16/f16: an all-to-all moves block j of every rank to rank j
//     as raw bytes (16-bit words stay 16-bit on the wire), rank j folds the N blocks in rank order
//     in f32/f64/int64 (comm_fold.h), and all_reduce all-gathers the folded blocks. The volume is
//     that of reduce-scatter + all-gather, the bandwidth-optimal all-reduce.
// Scratch: the all-to-all receive buffer (N blocks) and, for all_reduce, the padded copy of x,
// both tagged MemTag::kComm and released before the call returns.
#include "engine/comm_mpi.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "engine/comm_fold.h"
#include "engine/profile.h"

#ifdef LEANTUNE_WITH_MPI
#include <mpi.h>
#endif

namespace leantune::comm_detail {

#ifndef LEANTUNE_WITH_MPI

bool mpi_available() { return false; }
std::unique_ptr<Communicator> make_mpi_world(const CommOptions&) {
  LT_THROW(ErrorKind::kInput, "this build of leantune has no MPI");
}
std::unique_ptr<Communicator> make_mpi_from_handle(int64_t, const CommOptions&) {
  LT_THROW(ErrorKind::kInput,
           "an MPI communicator was given, but this build of leantune has no MPI");
}
void mpi_abort_if_initialized(int) {}
void mpi_finalize_if_initialized() {}

#else

namespace {

using Clock = std::chrono::steady_clock;

bool mpi_running() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

int checked_count(int64_t n, const char* what) {
  LT_CHECK_INPUT(n <= INT_MAX, "comm ", what, ": a message of ", n,
                 " elements is over MPI's 2^31-1 limit per call; use smaller buckets");
  return static_cast<int>(n);
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kI32:
      return MPI_INT32_T;
    default:
      return MPI_DATATYPE_NULL;  // 16-bit floats travel as bytes and are folded here
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    default:
      return MPI_SUM;
  }
}

void check_cpu_tensor(const Tensor& t, const char* what, CommUse use = CommUse::kMove) {
  LT_CHECK(t.defined() && t.is_contiguous(), "comm ", what, ": tensor must be contiguous");
  LT_CHECK(t.device().is_cpu(), "comm ", what, ": the MPI backend moves CPU tensors; ", t.str(),
           " needs the NCCL backend");
  check_comm_dtype(t.dtype(), what, use);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, const CommOptions& opt) : comm_(comm), opt_(opt) {
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_CHECK(MPI_Comm_dup(comm_, &heartbeat_));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    MPI_CHECK(MPI_Comm_free(&node));
    // Errors come back as codes (MPI_CHECK) rather than aborting inside the library.
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_set_errhandler(heartbeat_, MPI_ERRORS_RETURN));
  }
  ~MpiCommunicator() override {
    if (!mpi_running()) return;
    MPI_Comm_free(&heartbeat_);
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string backend_name() const override { return "mpi"; }
  bool deterministic() const override { return opt_.deterministic; }
  double timeout_seconds() const override { return opt_.timeout_seconds; }

  void all_reduce(Tensor& x, ReduceOp op) override {
    ProfileScope prof(OpKind::kComm, Device::cpu());
    check_cpu_tensor(x, "all_reduce", CommUse::kReduce);
    const int64_t n = x.numel();
    if (n == 0) return;
    const MPI_Datatype t = mpi_type(x.dtype());
    if (!opt_.deterministic && t != MPI_DATATYPE_NULL) {
      std::vector<MPI_Request> req(1);
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, x.data_ptr(), checked_count(n, "all_reduce"), t,
                               mpi_op(op), comm_, &req[0]));
      wait(req, "all_reduce", -1);
      if (op == ReduceOp::kAvg) scale_in_place(x, 1.0 / size_);
      return;
    }
    // Rank-order fold: pad to N equal blocks, reduce-scatter by all-to-all, all-gather.
    const int64_t block = (n + size_ - 1) / size_;
    const size_t esz = x.element_size();
    Tensor padded = Tensor::zeros({block * size_}, x.dtype(), Device::cpu(), MemTag::kComm);
    std::memcpy(padded.data_ptr(), x.data_ptr(), n * esz);
    Tensor mine = Tensor::empty({block}, x.dtype(), Device::cpu(), MemTag::kComm);
    fold_scatter(padded.data_ptr(), mine.data_ptr(), block, x.dtype(), op, "all_reduce");
    std::vector<MPI_Request> req(1);
    const int bytes = checked_count(block * static_cast<int64_t>(esz), "all_reduce");
    MPI_CHECK(MPI_Iallgather(mine.data_ptr(), bytes, MPI_BYTE, padded.data_ptr(), bytes, MPI_BYTE,
                             comm_, &req[0]));
    wait(req, "all_reduce", -1);
    std::memcpy(x.data_ptr(), padded.data_ptr(), n * esz);
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    ProfileScope prof(OpKind::kComm, Device::cpu());
    check_cpu_tensor(in, "reduce_scatter", CommUse::kReduce);
    check_cpu_tensor(out, "reduce_scatter", CommUse::kReduce);
    check_scatter_blocks(in, out, size_, "reduce_scatter");
    LT_CHECK(in.data_ptr() != out.data_ptr() || size_ == 1, "reduce_scatter: out aliases in");
    const int64_t n = out.numel();
    if (n == 0) return;
    const MPI_Datatype t = mpi_type(in.dtype());
    if (!opt_.deterministic && t != MPI_DATATYPE_NULL) {
      std::vector<MPI_Request> req(1);
      MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(),
                                          checked_count(n, "reduce_scatter"), t, mpi_op(op), comm_,
                                          &req[0]));
      wait(req, "reduce_scatter", -1);
      if (op == ReduceOp::kAvg) scale_in_place(out, 1.0 / size_);
      return;
    }
    fold_scatter(in.data_ptr(), out.data_ptr(), n, in.dtype(), op, "reduce_scatter");
  }

  void reduce_scatter_accumulate(const Tensor& in, Tensor& out) override {
    ProfileScope prof(OpKind::kComm, Device::cpu());
    check_cpu_tensor(in, "reduce_scatter_accumulate", CommUse::kReduce);
    check_cpu_tensor(out, "reduce_scatter_accumulate", CommUse::kReduce);
    check_scatter_blocks(in, out, size_, "reduce_scatter_accumulate");
    const int64_t n = out.numel();
    if (n == 0) return;
    if (!opt_.deterministic && mpi_type(in.dtype()) != MPI_DATATYPE_NULL) {
      Communicator::reduce_scatter_accumulate(in, out);
      return;
    }
    fold_scatter(in.data_ptr(), out.data_ptr(), n, in.dtype(), ReduceOp::kSum,
                 "reduce_scatter_accumulate", out.data_ptr());
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    ProfileScope prof(OpKind::kComm, Device::cpu());
    check_cpu_tensor(in, "all_gather");
    check_cpu_tensor(out, "all_gather");
    check_gather_blocks(in, out, size_, "all_gather");
    if (in.numel() == 0) return;
    const int bytes = checked_count(static_cast<int64_t>(in.nbytes()), "all_gather");
    std::vector<MPI_Request> req(1);
    const bool in_place =
        static_cast<const char*>(in.data_ptr()) ==
        static_cast<const char*>(out.data_ptr()) + static_cast<size_t>(rank_) * in.nbytes();
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data_ptr(), bytes, MPI_BYTE,
                             out.data_ptr(), bytes, MPI_BYTE, comm_, &req[0]));
    wait(req, "all_gather", -1);
  }

  std::unique_ptr<PendingCollective> start_all_gather(const Tensor& in, Tensor& out) override {
    check_cpu_tensor(in, "all_gather");
    check_cpu_tensor(out, "all_gather");
    check_gather_blocks(in, out, size_, "all_gather");
    LT_CHECK(in.data_ptr() != out.data_ptr() || size_ == 1, "start_all_gather: out aliases in");
    auto pending = std::make_unique<Pending>(*this);
    if (in.numel() == 0) return pending;
    const int bytes = checked_count(static_cast<int64_t>(in.nbytes()), "all_gather");
    pending->req.resize(1);
    MPI_CHECK(MPI_Iallgather(in.data_ptr(), bytes, MPI_BYTE, out.data_ptr(), bytes, MPI_BYTE, comm_,
                             &pending->req[0]));
    return pending;
  }

  void broadcast(Tensor& x, int root) override {
    ProfileScope prof(OpKind::kComm, Device::cpu());
    check_cpu_tensor(x, "broadcast");
    LT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside 0..", size_ - 1);
    if (x.numel() == 0) return;
    std::vector<MPI_Request> req(1);
    MPI_CHECK(MPI_Ibcast(x.data_ptr(), checked_count(static_cast<int64_t>(x.nbytes()), "broadcast"),
                         MPI_BYTE, root, comm_, &req[0]));
    wait(req, "broadcast", root);
  }

  void group_start() override { ++group_depth_; }
  void group_end() override {
    LT_CHECK(group_depth_ > 0, "group_end without group_start");
    if (--group_depth_ > 0) return;
    std::vector<MPI_Request> reqs;
    reqs.swap(group_reqs_);
    const int peer = group_peer_;
    group_peer_ = -1;
    wait(reqs, "send/recv group", peer);
    group_keep_.clear();
  }
  void send(const Tensor& x, int peer) override { p2p(const_cast<Tensor&>(x), peer, true); }
  void recv(Tensor& x, int peer) override { p2p(x, peer, false); }

  void barrier() override {
    std::vector<MPI_Request> req(1);
    MPI_CHECK(MPI_Ibarrier(comm_, &req[0]));
    wait(req, "barrier", -1);
  }

  double all_reduce_scalar(double v, ReduceOp op) override {
    ProfileScope prof(OpKind::kComm, Device::cpu());
    const std::vector<double> all = all_gather_scalar(v);
    double r = 0;
    fold_rank_order(all.data(), size_, 1, DType::kF64, op, &r);
    return r;
  }
  int64_t all_reduce_int(int64_t v, ReduceOp op) override {
    ProfileScope prof(OpKind::kComm, Device::cpu());
    LT_CHECK(op != ReduceOp::kAvg, "all_reduce_int: avg of an integer");
    std::vector<int64_t> all(size_);
    std::vector<MPI_Request> req(1);
    MPI_CHECK(MPI_Iallgather(&v, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, comm_, &req[0]));
    wait(req, "all_reduce_int", -1);
    int64_t r = 0;
    fold_rank_order(all.data(), size_, 1, DType::kI64, op, &r);
    return r;
  }
  std::vector<double> all_gather_scalar(double v) override {
    ProfileScope prof(OpKind::kComm, Device::cpu());
    std::vector<double> all(size_);
    std::vector<MPI_Request> req(1);
    MPI_CHECK(MPI_Iallgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm_, &req[0]));
    wait(req, "all_gather_scalar", -1);
    return all;
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    LT_CHECK(color >= 0, "split: color ", color, " must be >= 0");
    // MPI_Comm_split blocks with no deadline; a timed exchange first makes sure every peer is
    // there to take part.
    (void)all_gather_scalar(static_cast<double>(color));
    MPI_Comm sub;
    MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    return std::make_unique<MpiCommunicator>(sub, opt_);
  }

  std::unique_ptr<Communicator> duplicate(const CommOptions& options) override {
    (void)all_gather_scalar(0.0);  // MPI_Comm_dup blocks; make sure every peer is there
    MPI_Comm dup;
    MPI_CHECK(MPI_Comm_dup(comm_, &dup));
    return std::make_unique<MpiCommunicator>(dup, options);
  }

 private:
  // A started all_gather: MPI progresses it inside any later MPI call (Open MPI has no progress
  // thread by default), and wait() completes it under the timeout like every call.
  struct Pending final : PendingCollective {
    explicit Pending(MpiCommunicator& c) : comm(c) {}
    ~Pending() override {
      if (req.empty() || !mpi_running()) return;
      try {
        wait();
      } catch (const Error&) {
        // The peer is lost: the next collective on this communicator reports it.
      }
    }
    void poll() override {
      if (req.empty()) return;
      int done = 0;
      MPI_CHECK(MPI_Testall(static_cast<int>(req.size()), req.data(), &done, MPI_STATUSES_IGNORE));
      if (done) req.clear();
    }
    void wait() override {
      if (req.empty()) return;
      std::vector<MPI_Request> r = std::move(req);
      req.clear();
      comm.wait(r, "all_gather (prefetch)", -1);
    }
    MpiCommunicator& comm;
    std::vector<MPI_Request> req;
  };

  // Block j of every rank's `in` (n elements each) goes to rank j, which folds them in rank
  // order into `out`. With `init` (n elements, may be `out`), the fold starts from it: it is row
  // 0 of the folded rows, ahead of rank 0's block.
  void fold_scatter(const void* in, void* out, int64_t n, DType dtype, ReduceOp op,
                    const char* what, const void* init = nullptr) {
    const size_t esz = dtype_size(dtype);
    const int64_t rows = size_ + (init ? 1 : 0);
    Tensor recv = Tensor::empty({n * rows}, dtype, Device::cpu(), MemTag::kComm);
    char* blocks = static_cast<char*>(recv.data_ptr()) + (init ? n * esz : 0);
    if (init) std::memcpy(recv.data_ptr(), init, n * esz);
    const int bytes = checked_count(n * static_cast<int64_t>(esz), what);
    std::vector<MPI_Request> req(1);
    MPI_CHECK(MPI_Ialltoall(in, bytes, MPI_BYTE, blocks, bytes, MPI_BYTE, comm_, &req[0]));
    wait(req, what, -1);
    fold_rank_order(recv.data_ptr(), rows, n, dtype, op, out);
  }

  void scale_in_place(Tensor& x, double s) {
    if (x.dtype() == DType::kF32) {
      float* p = x.data<float>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<float>(p[i] * s);
    } else if (x.dtype() == DType::kF64) {
      double* p = x.data<double>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] *= s;
    } else {
      LT_THROW(ErrorKind::kInternal, "comm: avg of ", x.str());
    }
  }

  void p2p(Tensor& x, int peer, bool is_send) {
    const char* what = is_send ? "send" : "recv";
    check_cpu_tensor(x, what);
    LT_CHECK(peer >= 0 && peer < size_, what, ": peer ", peer, " outside 0..", size_ - 1);
    const int bytes = checked_count(static_cast<int64_t>(x.nbytes()), what);
    MPI_Request r;
    if (is_send)
      MPI_CHECK(MPI_Isend(x.data_ptr(), bytes, MPI_BYTE, peer, kP2pTag, comm_, &r));
    else
      MPI_CHECK(MPI_Irecv(x.data_ptr(), bytes, MPI_BYTE, peer, kP2pTag, comm_, &r));
    if (group_depth_ == 0) {
      std::vector<MPI_Request> req{r};
      wait(req, what, peer);
      return;
    }
    group_reqs_.push_back(r);
    group_keep_.push_back(x);  // the buffer stays alive until group_end
    group_peer_ = group_peer_ == -1 || group_peer_ == peer ? peer : -2;
  }

  // Completes every request or throws kComm at the deadline, naming the lost peers.
  void wait(std::vector<MPI_Request>& reqs, const char* what, int peer) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(opt_.timeout_seconds);
    int spins = 0;
    for (;;) {
      int done = 0;
      const int rc =
          MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS)
        LT_THROW(ErrorKind::kComm, "rank ", rank_, ": ", what, " failed (",
                 detail::mpi_error_string(rc), "); ", lost_peers(peer));
      if (done) return;
      if (Clock::now() >= deadline) break;
      // Nonblocking collectives progress only inside MPI calls: test without pause for the
      // first 20 ms (latency and bandwidth), then pause 50 us between tests so that ranks
      // sharing cores, or waiting on a slow peer, leave the CPU to others.
      if (++spins > 64 && Clock::now() - start > std::chrono::milliseconds(20))
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    LT_THROW(ErrorKind::kComm, "rank ", rank_, ": ", what, " got no answer within ",
             opt_.timeout_seconds, " s (--comm_timeout); ", lost_peers(peer));
  }

  // Every timed-out rank announces itself to all peers on the heartbeat communicator; those
  // that do not within the grace period are dead or stuck outside any collective.
  std::string lost_peers(int peer) {
    const double grace = std::min(30.0, std::max(1.0, opt_.timeout_seconds * 0.25));
    std::vector<MPI_Request> reqs;
    std::vector<int> heard(size_, 0), me(1, rank_);
    std::vector<MPI_Request> recv_req(size_, MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request s;
      if (MPI_Isend(me.data(), 1, MPI_INT, r, kHeartbeatTag, heartbeat_, &s) == MPI_SUCCESS)
        MPI_Request_free(&s);
      MPI_Irecv(&heard[r], 1, MPI_INT, r, kHeartbeatTag, heartbeat_, &recv_req[r]);
    }
    const auto end = Clock::now() + std::chrono::duration<double>(grace);
    std::vector<bool> alive(size_, false);
    alive[rank_] = true;
    while (Clock::now() < end) {
      bool all = true;
      for (int r = 0; r < size_; ++r) {
        if (alive[r]) continue;
        int flag = 0;
        if (MPI_Test(&recv_req[r], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)
          alive[r] = true;
        else
          all = false;
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::string lost;
    for (int r = 0; r < size_; ++r) {
      if (alive[r]) continue;
      if (recv_req[r] != MPI_REQUEST_NULL) MPI_Cancel(&recv_req[r]);
      lost += (lost.empty() ? "" : ", ") + std::to_string(r);
    }
    if (lost.empty())
      return "every peer answered a heartbeat, so the ranks disagree on the order of collectives" +
             (peer >= 0 ? " (waiting on rank " + std::to_string(peer) + ")" : std::string());
    return "rank" + std::string(lost.find(',') == std::string::npos ? " " : "s ") + lost +
           " lost (dead or stuck: no heartbeat within " + std::to_string(static_cast<int>(grace)) +
           " s)";
  }

  static constexpr int kP2pTag = 17;
  static constexpr int kHeartbeatTag = 23;
  MPI_Comm comm_;
  MPI_Comm heartbeat_ = MPI_COMM_NULL;
  CommOptions opt_;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  int group_depth_ = 0;
  int group_peer_ = -1;  // the one peer of the current group, -2 when several
  std::vector<MPI_Request> group_reqs_;
  std::vector<Tensor> group_keep_;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> make_mpi_world(const CommOptions& options) {
  int init = 0;
  MPI_CHECK(MPI_Initialized(&init));
  if (!init) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
  }
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options);
}

std::unique_ptr<Communicator> make_mpi_from_handle(int64_t fortran_handle,
                                                   const CommOptions& options) {
  LT_CHECK_INPUT(mpi_running(),
                 "an MPI communicator was given, but MPI is not initialised (the "
                 "caller calls MPI_Init before handing one over, and MPI_Finalize after)");
  LT_CHECK_INPUT(fortran_handle >= INT_MIN && fortran_handle <= INT_MAX, "MPI communicator handle ",
                 fortran_handle, ": not an MPI_Fint (MPI_Comm_c2f)");
  const MPI_Comm given = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
  LT_CHECK_INPUT(given != MPI_COMM_NULL, "the MPI communicator given is MPI_COMM_NULL");
  // A duplicate: leantune's messages never match the caller's, whatever tags either uses. The
  // MpiCommunicator owns it and frees it.
  MPI_Comm mine = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(given, &mine));
  return std::make_unique<MpiCommunicator>(mine, options);
}

void mpi_abort_if_initialized(int exit_code) {
  if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

void mpi_finalize_if_initialized() {
  if (mpi_running()) MPI_Finalize();
}

#endif  // LEANTUNE_WITH_MPI

}  // namespace leantune::comm_detail
