// The caching allocator and its backings (see allocator.h).
#include "engine/allocator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "engine/cuda_api.h"
#include "engine/cuda_backend.h"

namespace leantune {

namespace {
size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class HostBacking final : public MemoryBacking {
 public:
  explicit HostBacking(bool pinned) : pinned_(pinned) {}
  Device device() const override { return Device::cpu(); }
  void* raw_alloc(size_t bytes) override {
    return std::aligned_alloc(4096, round_up(std::max<size_t>(bytes, 1), 4096));
  }
  void raw_free(void* ptr, size_t) override { std::free(ptr); }
  void* event_record(const Stream&) override { return nullptr; }
  bool event_query(void*) override { return true; }
  void event_destroy(void*) override {}
  void synchronize() override {}
  std::string name() const override { return pinned_ ? "host (pinned pool)" : "host"; }

 private:
  bool pinned_;
};
}  // namespace

const char* mem_tag_name(MemTag tag) {
  static constexpr const char* kNames[kNumMemTags] = {
      "param", "grad", "optimizer", "activation", "workspace", "kv_cache", "comm", "other"};
  auto i = static_cast<int>(tag);
  LT_CHECK(i >= 0 && i < kNumMemTags, "bad tag ", i);
  return kNames[i];
}

namespace {
thread_local MemTag t_mem_tag = MemTag::kActivation;
}
MemTag current_mem_tag() { return t_mem_tag; }
MemTagGuard::MemTagGuard(MemTag tag) : prev_(t_mem_tag) { t_mem_tag = tag; }
MemTagGuard::~MemTagGuard() { t_mem_tag = prev_; }

namespace {
std::atomic<const char*> g_mem_phase{""};
}
void set_step_phase(const char* phase) { g_mem_phase.store(phase, std::memory_order_relaxed); }
const char* step_phase() { return g_mem_phase.load(std::memory_order_relaxed); }
StepPhaseGuard::StepPhaseGuard(const char* phase) : prev_(step_phase()) { set_step_phase(phase); }
StepPhaseGuard::~StepPhaseGuard() { set_step_phase(prev_); }

std::unique_ptr<MemoryBacking> make_host_backing(bool pinned) {
  return std::make_unique<HostBacking>(pinned);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  size_t requested = 0;
  uint64_t stream = 0;
  bool allocated = false;
  bool small = false;
  int event_count = 0;
  MemTag tag = MemTag::kOther;
  uint64_t id = 0;
  uint64_t segment_id = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<Stream> stream_uses;
};

namespace {
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};
}  // namespace

struct Allocator::Pool {
  bool small;
  std::set<Block*, BlockLess> blocks;
};

Allocator::Allocator(std::unique_ptr<MemoryBacking> backing, AllocatorSettings settings)
    : backing_(std::move(backing)),
      small_(new Pool{true, {}}),
      large_(new Pool{false, {}}),
      settings_(settings),
      t0_ns_(now_ns()) {
  LT_CHECK(settings_.round_to >= 1 && settings_.round_large >= 1 && settings_.small_segment >= 1,
           "allocator settings: rounding and segment sizes must be >= 1");
  const char* env = std::getenv("LEANTUNE_ALLOC_POISON");
  poison_ = env && env[0] == '1' && backing_->device().is_cpu();
}

void Allocator::set_poison(bool on) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  poison_ = on && backing_->device().is_cpu();
}

Allocator::~Allocator() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (trace_on_) want_mem_sites(false);  // one recorder fewer
  for (auto& [ev, b] : pending_) backing_->event_destroy(ev);
  for (Block* head : segments_) {
    void* base = head->ptr;
    size_t total = 0;
    for (Block* b = head; b;) {
      Block* n = b->next;
      total += b->size;
      delete b;
      b = n;
    }
    backing_->raw_free(base, total);
  }
}

Device Allocator::device() const { return backing_->device(); }
void* Allocator::block_ptr(const Block* b) { return b->ptr; }
size_t Allocator::block_size(const Block* b) { return b->size; }
MemTag Allocator::block_tag(const Block* b) { return b->tag; }

void Allocator::record(TraceEvent::Kind kind, uint64_t id, int64_t size, MemTag tag,
                       uint64_t stream, const Block* block) {
  if (!trace_on_) return;
  TraceEvent e{kind, id, size, tag, stream, now_ns() - t0_ns_, current_mem_phase()};
  e.site = current_mem_site();
  if (block) {
    e.segment = block->segment_id;
    for (const Block* p = block->prev; p; p = p->prev) e.offset += static_cast<int64_t>(p->size);
  }
  trace_.push_back(e);
}

Block* Allocator::find_free_block(Pool& pool, size_t size, uint64_t stream) {
  Block key;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  auto it = pool.blocks.lower_bound(&key);
  if (settings_.cross_stream_reuse) {
    // The smallest fitting block of any stream (the pool is ordered by stream first).
    Block* best = nullptr;
    for (Block* c : pool.blocks)
      if (c->size >= size && (!best || c->size < best->size)) best = c;
    if (!best) return nullptr;
    pool.blocks.erase(best);
    return best;
  }
  if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.blocks.erase(it);
  return b;
}

Block* Allocator::alloc_segment(Pool& pool, size_t segment_size, uint64_t stream, bool* ok) {
  *ok = false;
  if (limit_ != 0 && static_cast<size_t>(stats_.reserved.current) + segment_size > limit_)
    return nullptr;
  void* p = backing_->raw_alloc(segment_size);
  if (!p) return nullptr;
  auto* b = new Block;
  b->ptr = p;
  b->size = segment_size;
  b->stream = stream;
  b->small = pool.small;
  b->segment_id = next_segment_id_++;
  segments_.insert(b);
  stats_.reserved.add(static_cast<int64_t>(segment_size));
  stats_.window_reserved.add(static_cast<int64_t>(segment_size));
  stats_.segments++;
  stats_.num_segment_allocs++;
  record(TraceEvent::kSegmentAlloc, b->segment_id, static_cast<int64_t>(segment_size),
         MemTag::kOther, stream);
  *ok = true;
  return b;
}

Block* Allocator::allocate(size_t bytes, MemTag tag, const Stream& stream) {
  LT_CHECK(stream.device.type == device().type, "stream on ", stream.device.str(),
           " used with the allocator of ", device().str());
  std::lock_guard<std::recursive_mutex> lk(mu_);
  process_events();
  const AllocatorSettings& cfg = settings_;
  const size_t size = round_up(std::max<size_t>(bytes, 1), cfg.round_to);
  LT_CHECK(size >= bytes, "allocation size overflow: ", bytes);
  Pool& pool = size <= cfg.small_size ? *small_ : *large_;
  Block* b = find_free_block(pool, size, stream.id);
  if (!b) {
    const size_t seg = pool.small ? std::max(cfg.small_segment, size)
                                  : (size < cfg.min_large_alloc ? std::max(cfg.large_segment, size)
                                                                : round_up(size, cfg.round_large));
    bool ok = false;
    b = alloc_segment(pool, seg, stream.id, &ok);
    if (!ok) {
      stats_.num_alloc_retries++;
      backing_->synchronize();
      process_events();
      release_cached_segments();
      b = alloc_segment(pool, seg, stream.id, &ok);
    }
    if (!ok) {
      stats_.num_ooms++;
      record(TraceEvent::kOom, 0, static_cast<int64_t>(bytes), tag, stream.id);
      throw_oom(bytes, tag);
    }
  }
  const size_t remaining = b->size - size;
  const bool split = pool.small ? remaining >= std::max<size_t>(cfg.small_split_min, 1)
                                : remaining > cfg.large_split_min;
  if (split) {
    auto* rest = new Block;
    rest->ptr = static_cast<char*>(b->ptr) + size;
    rest->size = remaining;
    rest->stream = b->stream;
    rest->small = b->small;
    rest->segment_id = b->segment_id;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool.blocks.insert(rest);
  }
  b->allocated = true;
  b->requested = bytes;
  b->tag = tag;
  b->id = next_id_++;
  const auto sz = static_cast<int64_t>(b->size);
  stats_.allocated.add(sz);
  stats_.window_allocated.add(sz);
  stats_.requested.add(static_cast<int64_t>(bytes));
  stats_.by_tag[static_cast<int>(tag)].add(sz);
  if (stats_.allocated.current == stats_.allocated.peak) {
    stats_.reserved_at_peak_allocated = stats_.reserved.current;
    for (int i = 0; i < kNumMemTags; ++i) stats_.by_tag_at_peak[i] = stats_.by_tag[i].current;
    stats_.phase_at_peak = step_phase();
  }
  stats_.active_blocks++;
  stats_.num_allocs++;
  record(TraceEvent::kAlloc, b->id, sz, tag, stream.id, b);
  if (poison_) std::memset(b->ptr, 0xff, b->size);
  return b;
}

void Allocator::free(Block* b) {
  if (!b) return;
  std::lock_guard<std::recursive_mutex> lk(mu_);
  LT_CHECK(b->allocated, "double free of block ", b->id);
  const auto sz = static_cast<int64_t>(b->size);
  stats_.allocated.add(-sz);
  stats_.window_allocated.add(-sz);
  stats_.requested.add(-static_cast<int64_t>(b->requested));
  stats_.by_tag[static_cast<int>(b->tag)].add(-sz);
  stats_.active_blocks--;
  stats_.num_frees++;
  record(TraceEvent::kFree, b->id, sz, b->tag, b->stream);
  b->allocated = false;
  for (const Stream& s : b->stream_uses) {
    void* ev = backing_->event_record(s);
    if (ev) {
      pending_.emplace_back(ev, b);
      b->event_count++;
    }
  }
  b->stream_uses.clear();
  if (b->event_count == 0) free_block(b);
}

void Allocator::record_stream(Block* b, const Stream& s) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (s.id == b->stream) return;
  for (const Stream& u : b->stream_uses)
    if (u == s) return;
  b->stream_uses.push_back(s);
}

void Allocator::retag(Block* b, MemTag tag) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (b->tag == tag) return;
  const auto sz = static_cast<int64_t>(b->size);
  stats_.by_tag[static_cast<int>(b->tag)].add(-sz);
  stats_.by_tag[static_cast<int>(tag)].add(sz);
  b->tag = tag;
  record(TraceEvent::kRetag, b->id, sz, tag, b->stream);
}

// Called once no stream can still use b: only then may poisoning overwrite it (an in-flight copy
// out of a pinned block recorded on another stream must read the data, not 0xff).
void Allocator::free_block(Block* b) {
  if (poison_) std::memset(b->ptr, 0xff, b->size);
  Pool& pool = b->small ? *small_ : *large_;
  auto mergeable = [](const Block* n) { return n && !n->allocated && n->event_count == 0; };
  // `left` absorbs its neighbour `right`; `free_one` (one of the two) leaves the free pool first.
  auto absorb = [&pool](Block* left, Block* right, Block* free_one) {
    pool.blocks.erase(free_one);
    left->size += right->size;
    left->next = right->next;
    if (right->next) right->next->prev = left;
    delete right;
    return left;
  };
  if (mergeable(b->prev)) b = absorb(b->prev, b, b->prev);
  if (mergeable(b->next)) absorb(b, b->next, b->next);
  pool.blocks.insert(b);
}

void Allocator::process_events() {
  for (size_t i = 0; i < pending_.size();) {
    auto [ev, b] = pending_[i];
    if (backing_->event_query(ev)) {
      backing_->event_destroy(ev);
      pending_[i] = pending_.back();
      pending_.pop_back();
      if (--b->event_count == 0) free_block(b);
    } else {
      ++i;
    }
  }
}

void Allocator::release_segment(Block* head) {
  Pool& pool = head->small ? *small_ : *large_;
  pool.blocks.erase(head);
  segments_.erase(head);
  stats_.reserved.add(-static_cast<int64_t>(head->size));
  stats_.window_reserved.add(-static_cast<int64_t>(head->size));
  stats_.segments--;
  record(TraceEvent::kSegmentFree, head->segment_id, static_cast<int64_t>(head->size),
         MemTag::kOther, head->stream);
  backing_->raw_free(head->ptr, head->size);
  delete head;
}

bool Allocator::release_cached_segments() {
  std::vector<Block*> whole;
  for (Block* head : segments_)
    if (!head->prev && !head->next && !head->allocated && head->event_count == 0)
      whole.push_back(head);
  for (Block* h : whole) release_segment(h);
  return !whole.empty();
}

void Allocator::empty_cache() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  process_events();
  release_cached_segments();
}

void Allocator::set_memory_limit(size_t bytes) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  limit_ = bytes;
}
size_t Allocator::memory_limit() const {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  return limit_;
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  return stats_;
}

void Allocator::reset_peak_stats() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  stats_.allocated.peak = stats_.allocated.current;
  stats_.requested.peak = stats_.requested.current;
  stats_.reserved.peak = stats_.reserved.current;
  for (auto& t : stats_.by_tag) t.peak = t.current;
  for (int i = 0; i < kNumMemTags; ++i) stats_.by_tag_at_peak[i] = stats_.by_tag[i].current;
  stats_.reserved_at_peak_allocated = stats_.reserved.current;
  stats_.phase_at_peak = step_phase();
}

void Allocator::begin_window() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  stats_.window_allocated.peak = stats_.window_allocated.current;
  stats_.window_reserved.peak = stats_.window_reserved.current;
}

size_t Allocator::largest_free_block() const {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  size_t best = 0;
  for (const Pool* p : {small_.get(), large_.get()})
    for (const Block* b : p->blocks) best = std::max(best, b->size);
  return best;
}

void Allocator::throw_oom(size_t bytes, MemTag tag) {
  std::string by_tag;
  int64_t worst = -1;
  MemTag worst_tag = MemTag::kOther;
  for (int i = 0; i < kNumMemTags; ++i) {
    const int64_t cur = stats_.by_tag[i].current;
    if (cur == 0) continue;
    if (!by_tag.empty()) by_tag += ", ";
    by_tag += std::string(mem_tag_name(static_cast<MemTag>(i))) + " " + format_bytes(cur);
    if (cur > worst) {
      worst = cur;
      worst_tag = static_cast<MemTag>(i);
    }
  }
  // With nothing held yet (the first parameter of a huge model), the request itself is the cause.
  if (worst < 0) worst_tag = tag;
  const char* hint = "a smaller per_device_train_batch_size or max_length";
  switch (worst_tag) {
    case MemTag::kActivation:
      hint =
          "gradient_checkpointing, activation_offloading, or a smaller "
          "per_device_train_batch_size / max_length";
      break;
    case MemTag::kOptimizer:
    case MemTag::kGrad:
      hint = "use_peft (LoRA: gradients and optimizer states only for the adapters)";
      break;
    case MemTag::kParam:
      hint = "load_in_4bit / load_in_8bit with use_peft, or bf16";
      break;
    case MemTag::kKVCache:
      hint = "fewer generations or a shorter max_completion_length";
      break;
    default:
      break;
  }
  std::string limit = limit_ ? ", limit " + format_bytes(static_cast<int64_t>(limit_)) : "";
  LT_THROW(ErrorKind::kOutOfMemory, "out of memory on ", device().str(), ": tried to allocate ",
           format_bytes(static_cast<int64_t>(bytes)), " (", mem_tag_name(tag), "); allocated ",
           format_bytes(stats_.allocated.current), ", reserved ",
           format_bytes(stats_.reserved.current), limit, ", largest free block ",
           format_bytes(static_cast<int64_t>(largest_free_block())),
           "; held by tag: ", by_tag.empty() ? "nothing" : by_tag, ". Try ", hint, ".");
}

void Allocator::set_trace_enabled(bool on) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (on != trace_on_) want_mem_sites(on);
  trace_on_ = on;
}
int64_t Allocator::trace_clock_ns() const { return now_ns() - t0_ns_; }
bool Allocator::trace_enabled() const {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  return trace_on_;
}
std::vector<TraceEvent> Allocator::trace() const {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  return trace_;
}
void Allocator::clear_trace() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  trace_.clear();
}

std::string Allocator::trace_json() const {
  static constexpr const char* kKinds[] = {"alloc",        "free", "segment_alloc",
                                           "segment_free", "oom",  "retag"};
  std::lock_guard<std::recursive_mutex> lk(mu_);
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : trace_) {
    nlohmann::json ev = {
        {"kind", kKinds[e.kind]},          {"id", e.id},         {"size", e.size},
        {"tag", mem_tag_name(e.tag)},      {"stream", e.stream}, {"t_ns", e.time_ns},
        {"phase", mem_phase_name(e.phase)}};
    if (e.site != 0) ev["site"] = mem_site_name(e.site);
    if (e.kind == TraceEvent::kAlloc) {
      ev["segment"] = e.segment;
      ev["offset"] = e.offset;
    }
    events.push_back(std::move(ev));
  }
  nlohmann::json j = {{"device", device().str()}, {"events", events}};
  return j.dump();
}

Allocator& allocator(Device device) {
  // Never destroyed: tensors in static storage may outlive any destruction order we pick.
  static std::mutex mu;
  static Allocator* host = nullptr;
  static std::vector<Allocator*> cuda;
  std::lock_guard<std::mutex> lk(mu);
  if (device.is_cpu()) {
    if (!host) host = new Allocator(make_host_backing(false));
    return *host;
  }
  LT_CHECK_INPUT(device.index >= 0 && device.index < cuda_device_count(), "device ", device.str(),
                 " is not available (", cuda_device_count(), " CUDA devices",
                 cuda_device_count() == 0 ? ": " + cuda_backend_error() : std::string(), ")");
  if (cuda.size() <= static_cast<size_t>(device.index)) cuda.resize(device.index + 1, nullptr);
  if (!cuda[device.index])
    cuda[device.index] = new Allocator(cuda_make_device_backing(device.index));
  return *cuda[device.index];
}

Allocator& pinned_allocator() {
  static Allocator* pinned =
      new Allocator(cuda_available() ? cuda_make_pinned_backing() : make_host_backing(true));
  return *pinned;
}

}  // namespace leantune
