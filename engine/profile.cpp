// The per-op step profile (engine/profile.h): scopes record into the one active StepProfiler,
// host clocks on the CPU and pooled CUDA event pairs on a GPU, read at the end of the step.
#include "engine/profile.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/check.h"
#include "engine/cuda_api.h"

namespace leantune {

namespace profile_detail {
namespace {
uint32_t initial_flags() {
  const char* v = std::getenv("LEANTUNE_NVTX");
  return (v != nullptr && std::strcmp(v, "1") == 0) ? kNvtx : 0;
}
}  // namespace
std::atomic<uint32_t> g_flags{initial_flags()};
}  // namespace profile_detail

namespace {
using profile_detail::g_flags;
using profile_detail::kNvtx;
using profile_detail::kTiming;

constexpr uint8_t kPushed = 1, kCounted = 2, kTimed = 4;

// The profiler taking a step, and whether this thread is the one it times.
StepProfiler* g_profiler = nullptr;
thread_local bool t_profiling_thread = false;
const bool g_nvtx_env = (g_flags.load() & kNvtx) != 0;

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

const char* op_kind_name(OpKind kind) {
  static constexpr const char* kNames[kNumOpKinds] = {
      "linear fwd", "linear dx", "linear dW", "attention fwd", "attention bwd", "norm",    "rope",
      "activation", "loss",      "optimizer", "copy/offload",  "communication", "other op"};
  const int k = static_cast<int>(kind);
  return k >= 0 && k < kNumOpKinds ? kNames[k] : "?";
}

void ProfileScope::open(OpKind kind, Device device, const Stream* stream) {
  kind_ = kind;
  const uint32_t flags = g_flags.load(std::memory_order_relaxed);
  if ((flags & kNvtx) != 0 && device.is_cuda()) {
    nvtx_range_push(op_kind_name(kind));
    state_ |= kPushed;
  }
  if ((flags & kTiming) == 0 || !t_profiling_thread) return;
  StepProfiler& p = *g_profiler;
  state_ |= kCounted;
  if (p.depth_++ > 0) return;  // inside another op: its time is that op's
  state_ |= kTimed;
  if (device.is_cuda()) {
    const Stream s = stream != nullptr ? *stream : current_stream(device);
    StepProfiler::Pending e{kind, s != p.step_stream_, device.index, s.handle, nullptr, nullptr};
    e.start = p.take_event(device.index);
    e.end = p.take_event(device.index);
    p.pending_.push_back(e);
    slot_ = static_cast<int32_t>(p.pending_.size() - 1);
    cuda_event_record(e.start, e.stream);
  } else {
    start_ = std::chrono::steady_clock::now();
  }
}

void ProfileScope::close() noexcept {
  try {
    if ((state_ & kCounted) != 0 && t_profiling_thread && g_profiler != nullptr) {
      StepProfiler& p = *g_profiler;
      --p.depth_;
      if ((state_ & kTimed) != 0) {
        if (slot_ >= 0) {
          const StepProfiler::Pending& e = p.pending_[static_cast<size_t>(slot_)];
          cuda_event_record(e.end, e.stream);
        } else {
          OpProfileRow& r = p.step_ops_[static_cast<int>(kind_)];
          ++r.calls;
          r.ms += ms_since(start_);
        }
      }
    }
    if ((state_ & kPushed) != 0) nvtx_range_pop();
  } catch (...) {
    // A failing event record in a destructor: the step's end_step() reports the device error.
  }
  state_ = 0;
}

double StepProfile::ops_ms() const {
  double s = 0;
  for (const OpProfileRow& r : ops) s += r.ms;
  return s;
}

nlohmann::json StepProfile::to_json() const {
  const double n = steps > 0 ? static_cast<double>(steps) : 1.0;
  auto share = [&](double ms) { return step_ms > 0 ? ms / step_ms : 0.0; };
  nlohmann::json rows = nlohmann::json::array();
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpProfileRow& r = ops[k];
    if (r.calls == 0 && r.async_calls == 0) continue;
    rows.push_back({{"op", op_kind_name(static_cast<OpKind>(k))},
                    {"calls", r.calls},
                    {"ms", r.ms},
                    {"ms_per_step", r.ms / n},
                    {"share", share(r.ms)},
                    {"async_calls", r.async_calls},
                    {"async_ms", r.async_ms}});
  }
  return {{"device", device},
          {"timer", timer},
          {"steps", steps},
          {"step_ms", step_ms},
          {"ms_per_step", step_ms / n},
          {"ops", rows},
          {"other_ms", other_ms()},
          {"other_share", share(other_ms())}};
}

std::string StepProfile::table() const {
  const double n = steps > 0 ? static_cast<double>(steps) : 1.0;
  bool any_async = false;
  for (const OpProfileRow& r : ops) any_async = any_async || r.async_calls > 0;
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "step profile: %lld step(s) on %s (%s)\n",
                static_cast<long long>(steps), device.c_str(), timer.c_str());
  out += line;
  std::snprintf(line, sizeof line, "%-24s %8s %12s %12s %7s%s\n", "op", "calls", "total ms",
                "ms/step", "share", any_async ? "  async ms/step" : "");
  out += line;
  auto row = [&](const char* name, int64_t calls, double ms, const OpProfileRow* r) {
    const double share = step_ms > 0 ? 100.0 * ms / step_ms : 0.0;
    char c[24] = "";
    if (calls >= 0) std::snprintf(c, sizeof c, "%lld", static_cast<long long>(calls));
    std::snprintf(line, sizeof line, "%-24s %8s %12.3f %12.3f %6.1f%%", name, c, ms, ms / n, share);
    out += line;
    if (any_async && r != nullptr && r->async_calls > 0) {
      std::snprintf(line, sizeof line, "  %13.3f", r->async_ms / n);
      out += line;
    }
    out += "\n";
  };
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpProfileRow& r = ops[k];
    if (r.calls == 0 && r.async_calls == 0) continue;
    row(op_kind_name(static_cast<OpKind>(k)), r.calls, r.ms, &r);
  }
  row("other (not in any op)", -1, other_ms(), nullptr);
  row("step", -1, step_ms, nullptr);
  return out;
}

StepProfiler::~StepProfiler() {
  cancel_step();
  for (auto& [device, events] : free_events_)
    for (void* ev : events) {
      try {
        cuda_event_destroy(ev);
      } catch (...) {
        // The device is gone (the process is ending after an error): nothing left to free.
      }
    }
}

void* StepProfiler::take_event(int device) {
  std::vector<void*>& pool = free_events_[device];
  if (pool.empty()) return cuda_event_create(device);
  void* ev = pool.back();
  pool.pop_back();
  return ev;
}

void StepProfiler::begin_step(Device device) {
  LT_CHECK(!in_step_, "StepProfiler::begin_step: a step is already being profiled");
  LT_CHECK(g_profiler == nullptr, "StepProfiler::begin_step: another profiler is taking a step");
  const std::string name = device.str();
  LT_CHECK(profile_.steps == 0 || profile_.device == name, "StepProfiler: steps on ",
           profile_.device, " and ", name);
  profile_.device = name;
  profile_.timer = device.is_cuda() ? "cuda_events" : "steady_clock";
  step_ops_ = {};
  depth_ = 0;
  step_stream_ = current_stream(device);
  if (device.is_cuda()) {
    step_events_[0] = take_event(device.index);
    step_events_[1] = take_event(device.index);
    cuda_event_record(step_events_[0], step_stream_.handle);
  }
  in_step_ = true;
  g_profiler = this;
  t_profiling_thread = true;
  g_flags.fetch_or(kTiming | kNvtx, std::memory_order_relaxed);
  step_start_ = std::chrono::steady_clock::now();
}

void StepProfiler::release_pending() noexcept {
  for (const Pending& e : pending_) {
    free_events_[e.device].push_back(e.start);
    free_events_[e.device].push_back(e.end);
  }
  pending_.clear();
  for (void*& ev : step_events_) {
    if (ev != nullptr) free_events_[step_stream_.device.index].push_back(ev);
    ev = nullptr;
  }
}

void StepProfiler::end_step() {
  LT_CHECK(in_step_, "StepProfiler::end_step: no step is being profiled");
  const double host_ms = ms_since(step_start_);
  g_flags.store(g_nvtx_env ? kNvtx : 0, std::memory_order_relaxed);
  t_profiling_thread = false;
  g_profiler = nullptr;
  in_step_ = false;
  double step_ms = host_ms;
  try {
    if (step_stream_.device.is_cuda()) {
      cuda_event_record(step_events_[1], step_stream_.handle);
      cuda_event_synchronize(step_events_[1]);
      step_ms = cuda_event_elapsed_ms(step_events_[0], step_events_[1]);
      for (const Pending& e : pending_) {
        cuda_event_synchronize(e.end);  // work on other streams may still be running
        OpProfileRow& r = step_ops_[static_cast<int>(e.kind)];
        const double ms = cuda_event_elapsed_ms(e.start, e.end);
        if (e.async) {
          ++r.async_calls;
          r.async_ms += ms;
        } else {
          ++r.calls;
          r.ms += ms;
        }
      }
    }
  } catch (...) {
    release_pending();
    throw;
  }
  release_pending();
  ++profile_.steps;
  profile_.step_ms += step_ms;
  for (int k = 0; k < kNumOpKinds; ++k) {
    OpProfileRow& dst = profile_.ops[k];
    const OpProfileRow& src = step_ops_[k];
    dst.calls += src.calls;
    dst.ms += src.ms;
    dst.async_calls += src.async_calls;
    dst.async_ms += src.async_ms;
  }
}

void StepProfiler::cancel_step() noexcept {
  if (!in_step_) return;
  g_flags.store(g_nvtx_env ? kNvtx : 0, std::memory_order_relaxed);
  t_profiling_thread = false;
  g_profiler = nullptr;
  in_step_ = false;
  release_pending();
}

}  // namespace leantune
