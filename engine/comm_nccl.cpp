// The NCCL backend of the Communicator (engine/comm_nccl.h), host side.
//
// Bootstrap: rank 0 of the MPI communicator gets NCCL's unique id and broadcasts it over MPI;
// every rank selects its device and joins with a non-blocking NCCL communicator. MPI stays for
// host scalars, barriers and the id exchange of split/duplicate.
//
// Ordering: collectives run on the communicator's own stream. Each call makes that stream wait
// for the caller's current stream (an event, no host sync), enqueues the NCCL call, records a
// "done" event and makes the caller's stream wait for it, so compute issued later sees the
// result while the host goes on (overlap is the caller's choice of when to issue).
// all_reduce_then is the exception: it also queues the caller's consumer of the result on the
// communicator's stream and leaves the caller's stream free until wait_deferred(), so that
// backward kernels queued meanwhile overlap the gradient sums.
//
// Watchdog: a thread polls the pending "done" events and ncclCommGetAsyncError every 20 ms.
// A collective still pending after --comm_timeout, or an asynchronous NCCL error, aborts the
// NCCL communicator (ncclCommAbort, which releases kernels waiting on a dead peer) and makes
// the next call on this communicator throw Error(kComm) naming what timed out.
//
// Determinism: with --deterministic_comm a sum all-gathers the contributions (for
// reduce_scatter: an all-to-all of blocks by grouped send/recv) and folds them in rank order on
// the device (nccl_fold_rank_order), as the MPI backend does on the host.
#include "engine/comm_nccl.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/comm_fold.h"
#include "engine/cuda_api.h"
#include "engine/profile.h"
#include "engine/stream.h"

namespace leantune::comm_detail {
namespace {

using Clock = std::chrono::steady_clock;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> boot, int device, const CommOptions& opt)
      : boot_(std::move(boot)), device_(device), opt_(opt) {
    LT_CHECK_INPUT(nccl_available(), "--comm_backend nccl: this build of leantune has no NCCL");
    // The 128-byte id travels as 16 int64 words (a dtype every backend moves).
    std::vector<int64_t> id(kNcclUniqueIdBytes / sizeof(int64_t), 0);
    if (boot_->rank() == 0) nccl_get_unique_id(id.data());
    Tensor idt = Tensor::from_vector(id, {static_cast<int64_t>(id.size())});
    boot_->broadcast(idt, 0);
    cuda_set_device(device_);
    comm_ = nccl_comm_init(boot_->size(), boot_->rank(), idt.data_ptr(), device_);
    wait_ready("init");
    stream_ = new_stream(Device::cuda(device_));
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (failed_) {
      nccl_abort(comm_);
    } else {
      try {
        stream_.synchronize();
      } catch (...) {
      }
      nccl_destroy(comm_);
    }
  }

  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }
  int local_rank() const override { return boot_->local_rank(); }
  std::string backend_name() const override { return "nccl"; }
  bool deterministic() const override { return opt_.deterministic; }
  double timeout_seconds() const override { return opt_.timeout_seconds; }

  void all_reduce(Tensor& x, ReduceOp op) override {
    check(x, "all_reduce", CommUse::kReduce);
    if (x.numel() == 0) return;
    if (!opt_.deterministic) {
      issue("all_reduce", [&](void* s) {
        nccl_all_reduce(comm_, x.data_ptr(), x.data_ptr(), x.numel(), dtype_int(x), op_int(op), s);
      });
      return;
    }
    Tensor all = Tensor::empty({x.numel() * size()}, x.dtype(), x.device(), MemTag::kComm);
    issue("all_reduce", [&](void* s) {
      nccl_all_gather(comm_, x.data_ptr(), all.data_ptr(), x.numel(), dtype_int(x), s);
      nccl_fold_rank_order(all.data_ptr(), x.data_ptr(), size(), x.numel(), dtype_int(x),
                           op_int(op), s);
    });
    keep_until_done(all);
  }

  void all_reduce_then(Tensor& x, ReduceOp op, const std::function<void()>& then) override {
    if (opt_.deterministic || x.numel() == 0) {
      all_reduce(x, op);
      then();
      return;
    }
    check(x, "all_reduce", CommUse::kReduce);
    throw_if_failed();
    const Device dev = Device::cuda(device_);
    stream_.wait_stream(current_stream(dev));
    {
      ProfileScope prof(OpKind::kComm, stream_);
      nccl_all_reduce(comm_, x.data_ptr(), x.data_ptr(), x.numel(), dtype_int(x), op_int(op),
                      stream_.handle);
    }
    {
      StreamGuard on_comm(stream_);  // then()'s kernels queue behind the sum
      then();
    }
    defer("all_reduce", {x});
  }
  void reduce_scatter_then(const Tensor& in, Tensor& out, ReduceOp op,
                           const std::function<void()>& then) override {
    if (opt_.deterministic || out.numel() == 0) {
      reduce_scatter(in, out, op);
      then();
      return;
    }
    check(in, "reduce_scatter", CommUse::kReduce);
    check(out, "reduce_scatter", CommUse::kReduce);
    check_scatter_blocks(in, out, size(), "reduce_scatter");
    throw_if_failed();
    const Device dev = Device::cuda(device_);
    stream_.wait_stream(current_stream(dev));
    {
      ProfileScope prof(OpKind::kComm, stream_);
      nccl_reduce_scatter(comm_, in.data_ptr(), out.data_ptr(), out.numel(), dtype_int(in),
                          op_int(op), stream_.handle);
    }
    {
      StreamGuard on_comm(stream_);
      then();
    }
    defer("reduce_scatter", {in, out});
  }
  void wait_deferred() override {
    for (const auto& e : deferred_) e->wait(current_stream(Device::cuda(device_)));
    deferred_.clear();
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    check(in, "reduce_scatter", CommUse::kReduce);
    check(out, "reduce_scatter", CommUse::kReduce);
    check_scatter_blocks(in, out, size(), "reduce_scatter");
    const int64_t n = out.numel();
    if (n == 0) return;
    if (!opt_.deterministic) {
      issue("reduce_scatter", [&](void* s) {
        nccl_reduce_scatter(comm_, in.data_ptr(), out.data_ptr(), n, dtype_int(in), op_int(op), s);
      });
      return;
    }
    // All-to-all of blocks: block j of every rank goes to rank j, which folds them in order.
    Tensor recv = Tensor::empty({n * size()}, in.dtype(), in.device(), MemTag::kComm);
    const size_t bytes = static_cast<size_t>(n) * in.element_size();
    issue("reduce_scatter", [&](void* s) {
      nccl_group_start();
      for (int p = 0; p < size(); ++p) {
        nccl_send(comm_, static_cast<const char*>(in.data_ptr()) + p * bytes, bytes, p, s);
        nccl_recv(comm_, static_cast<char*>(recv.data_ptr()) + p * bytes, bytes, p, s);
      }
      nccl_group_end();
      nccl_fold_rank_order(recv.data_ptr(), out.data_ptr(), size(), n, dtype_int(in), op_int(op),
                           s);
    });
    keep_until_done(recv);
  }

  void reduce_scatter_accumulate(const Tensor& in, Tensor& out) override {
    if (!opt_.deterministic) {
      Communicator::reduce_scatter_accumulate(in, out);
      return;
    }
    check(in, "reduce_scatter_accumulate", CommUse::kReduce);
    check(out, "reduce_scatter_accumulate", CommUse::kReduce);
    check_scatter_blocks(in, out, size(), "reduce_scatter_accumulate");
    const int64_t n = out.numel();
    if (n == 0) return;
    // Row 0 of the folded rows is out's old value (copied on the caller's stream, which the
    // communicator's stream waits for), rows 1..N the ranks' blocks.
    Tensor recv = Tensor::empty({n * (size() + 1)}, in.dtype(), in.device(), MemTag::kComm);
    recv.narrow(0, 0, n).copy_(out.view({n}));
    const size_t bytes = static_cast<size_t>(n) * in.element_size();
    char* blocks = static_cast<char*>(recv.data_ptr()) + bytes;
    issue("reduce_scatter_accumulate", [&](void* s) {
      nccl_group_start();
      for (int p = 0; p < size(); ++p) {
        nccl_send(comm_, static_cast<const char*>(in.data_ptr()) + p * bytes, bytes, p, s);
        nccl_recv(comm_, blocks + p * bytes, bytes, p, s);
      }
      nccl_group_end();
      nccl_fold_rank_order(recv.data_ptr(), out.data_ptr(), size() + 1, n, dtype_int(in),
                           op_int(ReduceOp::kSum), s);
    });
    keep_until_done(recv);
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check(in, "all_gather");
    check(out, "all_gather");
    check_gather_blocks(in, out, size(), "all_gather");
    if (in.numel() == 0) return;
    issue("all_gather", [&](void* s) {
      nccl_all_gather(comm_, in.data_ptr(), out.data_ptr(), in.numel(), dtype_int(in), s);
    });
  }

  std::unique_ptr<PendingCollective> start_all_gather(const Tensor& in, Tensor& out) override {
    check(in, "all_gather");
    check(out, "all_gather");
    check_gather_blocks(in, out, size(), "all_gather");
    const Device dev = Device::cuda(device_);
    if (in.numel() == 0) return std::make_unique<StreamPending>(nullptr, dev);
    throw_if_failed();
    // The gather queues behind the caller's work so far; the caller's stream does not wait for
    // it until wait(), so the kernels it queues meanwhile overlap the transfer.
    stream_.wait_stream(current_stream(dev));
    {
      ProfileScope prof(OpKind::kComm, stream_);
      nccl_all_gather(comm_, in.data_ptr(), out.data_ptr(), in.numel(), dtype_int(in),
                      stream_.handle);
    }
    auto done = std::make_shared<Event>(dev);
    done->record(stream_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(
          Pending{done,
                  Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(opt_.timeout_seconds)),
                  "all_gather (prefetch)",
                  {in, out}});
      cv_.notify_all();
    }
    return std::make_unique<StreamPending>(done, dev);
  }

  void broadcast(Tensor& x, int root) override {
    check(x, "broadcast");
    LT_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " outside 0..", size() - 1);
    if (x.numel() == 0) return;
    issue("broadcast",
          [&](void* s) { nccl_broadcast(comm_, x.data_ptr(), x.numel(), dtype_int(x), root, s); });
  }

  void group_start() override {
    if (group_depth_++ == 0) {
      throw_if_failed();
      stream_.wait_stream(current_stream(Device::cuda(device_)));
      nccl_group_start();
    }
  }
  void group_end() override {
    LT_CHECK(group_depth_ > 0, "group_end without group_start");
    if (--group_depth_ > 0) return;
    nccl_group_end();
    finish_issue("send/recv group");
  }
  void send(const Tensor& x, int peer) override { p2p(const_cast<Tensor&>(x), peer, true); }
  void recv(Tensor& x, int peer) override { p2p(x, peer, false); }

  void barrier() override {
    wait_idle("barrier");
    boot_->barrier();
  }
  double all_reduce_scalar(double v, ReduceOp op) override {
    return boot_->all_reduce_scalar(v, op);
  }
  int64_t all_reduce_int(int64_t v, ReduceOp op) override { return boot_->all_reduce_int(v, op); }
  std::vector<double> all_gather_scalar(double v) override { return boot_->all_gather_scalar(v); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    wait_idle("split");
    return std::make_unique<NcclCommunicator>(boot_->split(color, key), device_, opt_);
  }
  std::unique_ptr<Communicator> duplicate(const CommOptions& options) override {
    wait_idle("duplicate");
    return std::make_unique<NcclCommunicator>(boot_->duplicate(options), device_, options);
  }

 private:
  struct Pending {
    std::shared_ptr<Event> done;
    Clock::time_point deadline;
    std::string what;
    std::vector<Tensor> keep;  // scratch that must outlive the queued work
  };

  // A started collective: wait() makes the caller's current stream wait for its event (the
  // watchdog reports a peer that never answers).
  class StreamPending final : public PendingCollective {
   public:
    StreamPending(std::shared_ptr<Event> done, Device dev) : done_(std::move(done)), dev_(dev) {}
    ~StreamPending() override {
      try {
        wait();
      } catch (const Error&) {
        // A failed device: the next call on the communicator reports it.
      }
    }
    void wait() override {
      if (done_) done_->wait(current_stream(dev_));
      done_.reset();
    }

   private:
    std::shared_ptr<Event> done_;
    Device dev_;
  };

  static int dtype_int(const Tensor& t) { return static_cast<int>(t.dtype()); }
  static int op_int(ReduceOp op) { return static_cast<int>(op); }

  void check(const Tensor& t, const char* what, CommUse use = CommUse::kMove) const {
    LT_CHECK(t.defined() && t.is_contiguous(), "comm ", what, ": tensor must be contiguous");
    LT_CHECK(t.device() == Device::cuda(device_), "comm ", what,
             ": the NCCL backend moves tensors "
             "on cuda:",
             device_, "; got ", t.str());
    check_comm_dtype(t.dtype(), what, use);
  }

  template <typename F>
  void issue(const char* what, F&& enqueue) {
    throw_if_failed();
    stream_.wait_stream(current_stream(Device::cuda(device_)));
    {
      ProfileScope prof(OpKind::kComm, stream_);
      enqueue(stream_.handle);
    }
    finish_issue(what);
  }

  void finish_issue(const char* what) {
    auto done = std::make_shared<Event>(Device::cuda(device_));
    done->record(stream_);
    done->wait(current_stream(Device::cuda(device_)));
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(
        Pending{done,
                Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(opt_.timeout_seconds)),
                what,
                {}});
    cv_.notify_all();
  }

  std::vector<std::shared_ptr<Event>> deferred_;  // the *_then calls', not yet waited for

  // Records the end of a deferred collective on the communicator's stream without making the
  // caller's stream wait; `keep` (its buffers) lives until the event has completed.
  void defer(const char* what, std::vector<Tensor> keep) {
    auto done = std::make_shared<Event>(Device::cuda(device_));
    done->record(stream_);
    deferred_.push_back(done);
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(
        Pending{done,
                Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(opt_.timeout_seconds)),
                what, std::move(keep)});
    cv_.notify_all();
  }

  void keep_until_done(const Tensor& t) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_.empty()) pending_.back().keep.push_back(t);
  }

  void p2p(Tensor& x, int peer, bool is_send) {
    const char* what = is_send ? "send" : "recv";
    check(x, what);
    LT_CHECK(peer >= 0 && peer < size(), what, ": peer ", peer, " outside 0..", size() - 1);
    const bool alone = group_depth_ == 0;
    // Inside a group nothing is queued until group_end(): only a lone send/recv is timed.
    std::optional<ProfileScope> prof;
    if (alone) prof.emplace(OpKind::kComm, stream_);
    if (alone) group_start();
    if (is_send)
      nccl_send(comm_, x.data_ptr(), x.nbytes(), peer, stream_.handle);
    else
      nccl_recv(comm_, x.data_ptr(), x.nbytes(), peer, stream_.handle);
    if (alone) group_end();
  }

  // Blocks until the communicator finished its non-blocking initialisation (or fails).
  void wait_ready(const char* what) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(opt_.timeout_seconds));
    for (;;) {
      const int r = nccl_async_error(comm_);
      if (r == 0) return;
      if (r != 7) {
        nccl_abort(comm_);
        LT_THROW(ErrorKind::kComm, "rank ", rank(), ": NCCL ", what, ": ", nccl_error_string(r));
      }
      if (Clock::now() > deadline) {
        nccl_abort(comm_);
        LT_THROW(ErrorKind::kComm, "rank ", rank(), ": NCCL ", what, " did not finish within ",
                 opt_.timeout_seconds, " s (--comm_timeout); a peer is missing");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Waits until every queued collective is done, or the watchdog has failed the communicator.
  void wait_idle(const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_.empty() || failed_; });
    lock.unlock();
    throw_if_failed();
    (void)what;
  }

  void throw_if_failed() {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) LT_THROW(ErrorKind::kComm, error_);
  }

  void watch() {
    try {
      cuda_set_device(device_);
    } catch (...) {
    }
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_ && !failed_) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      while (!pending_.empty() && pending_.front().done->query()) pending_.pop_front();
      const int async = nccl_async_error(comm_);
      std::string why;
      if (async != 0 && async != 7) {
        why = "NCCL error " + nccl_error_string(async);
      } else if (!pending_.empty() && Clock::now() > pending_.front().deadline) {
        why = pending_.front().what + " got no answer within " +
              std::to_string(opt_.timeout_seconds) + " s (--comm_timeout); a peer is dead or stuck";
      }
      if (!why.empty()) {
        failed_ = true;
        error_ = "rank " + std::to_string(rank()) + ": " + why;
        lock.unlock();
        nccl_abort(comm_);  // releases kernels and host calls waiting on the dead peer
        lock.lock();
        pending_.clear();
      }
      cv_.notify_all();
    }
  }

  std::unique_ptr<Communicator> boot_;
  int device_;
  CommOptions opt_;
  void* comm_ = nullptr;
  Stream stream_;
  int group_depth_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  bool failed_ = false;
  std::string error_;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     int device, const CommOptions& options) {
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), device, options);
}

}  // namespace leantune::comm_detail
