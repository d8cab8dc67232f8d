// A per-op step profile, as llm.c prints one: the time of each op kind (linear forward, dx, dW,
// attention, norm, rope, activation, loss, optimizer, copies, communication) inside a training
// step, and its share of the step. Ops mark themselves with a ProfileScope at their entry point
// (kernels/*.cpp adapters, the CUDA linear backward, Optimizer::step, the offloader's copies, the
// NCCL and MPI collectives); a StepProfiler brackets the steps to measure.
//
// How time is taken:
//   - CPU: steady_clock around the scope (CPU ops run to completion on the calling thread).
//   - CUDA: a pair of timing events recorded on the op's stream, taken from a pool; they are
//     read with cudaEventElapsedTime in end_step(), so nothing inside the step synchronises.
//     The step itself is the time between two events on the step's stream. An op queued on
//     another stream (the copy stream of activation offloading, NCCL's) overlaps the step's
//     stream: its time is kept apart (async_ms) and not part of the step's shares.
// Nesting: only the OUTERMOST scope on the profiling thread is timed; a scope opened inside
// another op's scope (the GEMMs of the fused linear loss, a copy inside the optimizer) belongs to
// that op, so no time is counted twice. Time in no op (embedding, residual adds, autograd and
// allocator overhead, launch gaps, data on the host) is the "other" row: step minus the ops.
// Scopes on threads other than the one that called begin_step() are not timed.
//
// Off (the default), a scope costs one relaxed atomic load. NVTX ranges with the same names are
// pushed for scopes on CUDA devices while a profile is being taken, or always when the
// environment has LEANTUNE_NVTX=1 (for Nsight Systems on an unprofiled run); they nest.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/scope_guard.h"
#include "engine/stream.h"

namespace leantune {

enum class OpKind : uint8_t {
  kLinearFwd,
  kLinearDx,
  kLinearDw,  // dW and db
  kAttentionFwd,
  kAttentionBwd,
  kNorm,
  kRope,
  kActivation,  // swiglu / geglu
  kLoss,        // cross entropy, the fused linear loss (its GEMMs included), token logprobs
  kOptimizer,
  kCopy,  // activation offload/restore copies
  kComm,  // collectives and point-to-point
  kOther,
};
inline constexpr int kNumOpKinds = static_cast<int>(OpKind::kOther) + 1;

// "linear fwd", "linear dx", ..., "other op".
const char* op_kind_name(OpKind kind);

namespace profile_detail {
inline constexpr uint32_t kTiming = 1, kNvtx = 2;
// Which of kTiming / kNvtx is on; what a scope checks first.
extern std::atomic<uint32_t> g_flags;
}  // namespace profile_detail

// Marks one op. Construct it at the op's entry point, on the device (or stream) it runs on.
class ProfileScope : ScopeGuard {
 public:
  ProfileScope(OpKind kind, Device device) {
    if (profile_detail::g_flags.load(std::memory_order_relaxed) != 0) open(kind, device, nullptr);
  }
  ProfileScope(OpKind kind, const Stream& stream) {
    if (profile_detail::g_flags.load(std::memory_order_relaxed) != 0)
      open(kind, stream.device, &stream);
  }
  ~ProfileScope() {
    if (state_ != 0) close();
  }

 private:
  void open(OpKind kind, Device device, const Stream* stream);
  void close() noexcept;
  uint8_t state_ = 0;  // bits: 1 nvtx pushed, 2 counted in depth, 4 timed
  OpKind kind_ = OpKind::kOther;
  int32_t slot_ = -1;  // CUDA: index of the pending event pair
  std::chrono::steady_clock::time_point start_{};
};

struct OpProfileRow {
  int64_t calls = 0;
  double ms = 0;  // on the step's stream (CPU: all of it)
  int64_t async_calls = 0;
  double async_ms = 0;  // CUDA ops on other streams, overlapping the step
};

// The profile of one or more steps.
struct StepProfile {
  std::string device;  // "cpu", "cuda:0"
  std::string timer;   // "steady_clock" or "cuda_events"
  int64_t steps = 0;
  double step_ms = 0;  // summed over the steps
  std::array<OpProfileRow, kNumOpKinds> ops{};

  double ops_ms() const;  // sum of the rows' ms
  double other_ms() const { return step_ms - ops_ms(); }
  // JSON: device, timer, steps, step_ms, ms_per_step, ops: [{op, calls, ms, ms_per_step, share,
  // async_calls, async_ms}] (kinds with calls only), other_ms, other_share.
  nlohmann::json to_json() const;
  // An llm.c-style table: op, calls, total ms, ms per step, share of the step; an "other (not in
  // any op)" row and the step row; the async column only when some op ran on another stream.
  std::string table() const;
};

// Takes the profile of the steps bracketed by begin_step()/end_step() on one thread. One
// profiler at a time per process.
class StepProfiler {
 public:
  StepProfiler() = default;
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Starts timing on this thread; the step's time is taken on current_stream(device).
  void begin_step(Device device);
  // Stops timing, reads the events (waits for the step's work on a GPU) and adds the step.
  void end_step();
  // Drops a step in progress (an error or a skipped update in the middle); nothing is added.
  void cancel_step() noexcept;
  bool in_step() const { return in_step_; }
  const StepProfile& profile() const { return profile_; }

 private:
  friend class ProfileScope;
  struct Pending {
    OpKind kind;
    bool async;
    int device;
    void* stream;
    void* start;
    void* end;
  };
  void* take_event(int device);
  void release_pending() noexcept;

  StepProfile profile_;
  bool in_step_ = false;
  int depth_ = 0;  // open scopes on the profiling thread
  Stream step_stream_;
  std::chrono::steady_clock::time_point step_start_{};
  void* step_events_[2] = {nullptr, nullptr};
  std::vector<Pending> pending_;
  std::map<int, std::vector<void*>> free_events_;  // per CUDA device
  std::array<OpProfileRow, kNumOpKinds> step_ops_{};
};

}  // namespace leantune
