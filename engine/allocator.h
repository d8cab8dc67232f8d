// The caching allocator: one implementation over two backings (host memory and cudaMalloc).
//
// - Sizes round up to 512 bytes. Requests up to 1 MiB come from the small pool (2 MiB
//   segments); larger ones from the large pool (20 MiB segments below 10 MiB, otherwise the
//   request rounded to 2 MiB).
// - Best fit within a pool, only among blocks freed on the same stream. A block is split when
//   the remainder is >= 512 bytes (small pool) or > 1 MiB (large pool); freed neighbours inside
//   a segment coalesce.
// - record_stream(): a block used on other streams is reusable only after events recorded on
//   those streams at free time have completed.
// - On failure: free every cached, unsplit segment and retry once; then throw an Error of kind
//   kOutOfMemory that states the request, allocated and reserved totals, the largest free
//   block, the held bytes by tag, and which options would help.
// - Every allocation carries a MemTag. Stats: current/peak allocated per tag and in total,
//   reserved, segments, retries, OOMs. A trace of alloc/free/segment events can be recorded and
//   exported as JSON.
//
// Thread-safe (one mutex per allocator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/mem_phase.h"
#include "engine/scope_guard.h"
#include "engine/stream.h"

namespace leantune {

enum class MemTag : uint8_t {
  kParam,
  kGrad,
  kOptimizer,
  kActivation,
  kWorkspace,
  kKVCache,
  kComm,
  kOther,
};
constexpr int kNumMemTags = 8;
const char* mem_tag_name(MemTag tag);

// The tag new tensors get when none is given: kActivation unless a MemTagGuard says otherwise
// (the optimizer step runs under kOptimizer, generation under kKVCache, ...). Per thread.
MemTag current_mem_tag();
class MemTagGuard : ScopeGuard {
 public:
  explicit MemTagGuard(MemTag tag);
  ~MemTagGuard();

 private:
  MemTag prev_;
};

// The step phase the process is in ("forward", "loss", "backward", "optimizer step", "between
// steps"), recorded by every allocator when its allocation peaks, so that the memory report names
// where the peak fell in the same words as trainer_bin estimate's walk. Coarser than the
// per-thread allocation phase of engine/mem_phase.h, which attributes each traced event to a
// layer: this one is process-wide, so an offload copy or a backward node on any thread counts
// in the step phase around it. The string must outlive the run (a literal). Costs one relaxed
// load per new peak.
void set_step_phase(const char* phase);
const char* step_phase();
class StepPhaseGuard : ScopeGuard {
 public:
  explicit StepPhaseGuard(const char* phase);
  ~StepPhaseGuard();

 private:
  const char* prev_;
};

// Raw memory and event source under an Allocator.
class MemoryBacking {
 public:
  virtual ~MemoryBacking() = default;
  virtual Device device() const = 0;
  // nullptr when the memory is not available (never throws for that case).
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* ptr, size_t bytes) = 0;
  // An event recorded on `s` now; nullptr when nothing can be pending (host).
  virtual void* event_record(const Stream& s) = 0;
  virtual bool event_query(void* ev) = 0;
  virtual void event_destroy(void* ev) = 0;
  virtual void synchronize() = 0;
  virtual std::string name() const = 0;
};

std::unique_ptr<MemoryBacking> make_host_backing(bool pinned);

struct MemStat {
  int64_t current = 0;
  int64_t peak = 0;
  void add(int64_t d) {
    current += d;
    if (current > peak) peak = current;
  }
};

struct AllocatorStats {
  MemStat allocated;            // bytes in blocks handed out (rounded sizes)
  MemStat requested;            // bytes asked for
  MemStat reserved;             // bytes in segments obtained from the backing
  MemStat by_tag[kNumMemTags];  // allocated bytes per tag
  // allocated and reserved again, with peaks since the last begin_window(): the peak of one phase
  // of a run (the online trainers' generation and optimizer phases).
  MemStat window_allocated;
  MemStat window_reserved;
  int64_t segments = 0;       // current number of segments
  int64_t active_blocks = 0;  // current number of allocated blocks
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t num_segment_allocs = 0;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t reserved_at_peak_allocated = 0;
  int64_t by_tag_at_peak[kNumMemTags] = {};  // allocated bytes per tag when allocation peaked
  const char* phase_at_peak = "";            // step_phase() when allocation peaked
  // Reserved minus allocated at the moment allocation peaked.
  int64_t fragmentation_bytes() const { return reserved_at_peak_allocated - allocated.peak; }
  const MemStat& tag(MemTag t) const { return by_tag[static_cast<int>(t)]; }
};

struct TraceEvent {
  enum Kind : uint8_t { kAlloc, kFree, kSegmentAlloc, kSegmentFree, kOom, kRetag };
  Kind kind;
  uint64_t id;  // allocation id (kAlloc/kFree/kRetag), segment id (segment events)
  int64_t size;
  MemTag tag;  // kRetag: the block's new tag
  uint64_t stream;
  int64_t time_ns;
  MemPhase phase;        // what the thread was doing (engine/mem_phase.h)
  uint16_t site = 0;     // where within the phase (mem_site_name; 0: not known)
  uint64_t segment = 0;  // kAlloc: the segment holding the block
  int64_t offset = 0;    // kAlloc: the block's byte offset in its segment
};

// The caching policy's sizes (the defaults are the policy above). bench_allocator replays a trace
// under other settings to compare them.
struct AllocatorSettings {
  size_t round_to = 512;              // requests round up to a multiple of this (>= 1)
  size_t small_size = 1 << 20;        // requests up to this use the small pool
  size_t small_segment = 2 << 20;     // small-pool segment size
  size_t large_segment = 20 << 20;    // large-pool segment for requests below min_large_alloc
  size_t min_large_alloc = 10 << 20;  // larger requests get a segment of their own size
  size_t round_large = 2 << 20;       // ... rounded up to this
  size_t small_split_min = 512;       // a small-pool block splits when the rest is >= this
  size_t large_split_min = 1 << 20;   // a large-pool block splits when the rest is > this
  // Off: a freed block is reused only on the stream it was allocated on (safe without
  // synchronisation). On: any stream's cached block can serve a request (what a program that
  // synchronises its streams could afford); for comparing traces only.
  bool cross_stream_reuse = false;
};

struct Block;

class Allocator {
 public:
  explicit Allocator(std::unique_ptr<MemoryBacking> backing, AllocatorSettings settings = {});
  const AllocatorSettings& settings() const { return settings_; }
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns a block of at least `bytes` (bytes may be 0: a valid empty block).
  Block* allocate(size_t bytes, MemTag tag, const Stream& stream);
  void free(Block* block);
  // Marks the block as used on `stream` as well; its reuse waits for that stream at free time.
  void record_stream(Block* block, const Stream& stream);
  void retag(Block* block, MemTag tag);

  // Releases every cached segment with no allocated block.
  void empty_cache();
  // Caps reserved bytes (0 = no cap beyond the backing's own). Lets tests and planning runs
  // behave like a device of that size.
  void set_memory_limit(size_t bytes);
  size_t memory_limit() const;

  AllocatorStats stats() const;
  void reset_peak_stats();
  // Starts a new window: the window peaks restart from the current values.
  void begin_window();
  // Largest free cached block, in bytes.
  size_t largest_free_block() const;

  // Debug: fill every block handed out, and every block freed, with 0xFF bytes (NaN for every
  // float type), so that a kernel reading memory it never wrote, or memory already freed, fails
  // loudly instead of depending on what another user left there. Host backings only. Also
  // enabled by LEANTUNE_ALLOC_POISON=1.
  void set_poison(bool on);

  void set_trace_enabled(bool on);
  bool trace_enabled() const;
  std::vector<TraceEvent> trace() const;
  void clear_trace();
  // The trace's clock now (the t_ns a trace event would get), to mark moments in a trace.
  int64_t trace_clock_ns() const;
  // {"device": ..., "events": [{"kind","id","size","tag","stream","t_ns","phase"
  //  (+ "site" when known, + "segment","offset" for alloc)}...]}
  std::string trace_json() const;

  Device device() const;
  MemoryBacking& backing() { return *backing_; }

  static void* block_ptr(const Block* b);
  static size_t block_size(const Block* b);
  static MemTag block_tag(const Block* b);

 private:
  struct Pool;
  Block* find_free_block(Pool& pool, size_t size, uint64_t stream);
  Block* alloc_segment(Pool& pool, size_t segment_size, uint64_t stream, bool* ok);
  void free_block(Block* b);
  void process_events();
  bool release_cached_segments();
  void release_segment(Block* head);
  void record(TraceEvent::Kind kind, uint64_t id, int64_t size, MemTag tag, uint64_t stream,
              const Block* block = nullptr);
  [[noreturn]] void throw_oom(size_t bytes, MemTag tag);

  std::unique_ptr<MemoryBacking> backing_;
  mutable std::recursive_mutex mu_;
  std::unique_ptr<Pool> small_;
  std::unique_ptr<Pool> large_;
  std::vector<std::pair<void*, Block*>> pending_;  // (event, block) awaiting completion
  std::set<Block*> segments_;                      // segment head blocks
  AllocatorStats stats_;
  size_t limit_ = 0;
  AllocatorSettings settings_;
  uint64_t next_id_ = 1;
  uint64_t next_segment_id_ = 1;
  bool trace_on_ = false;
  bool poison_ = false;
  std::vector<TraceEvent> trace_;
  int64_t t0_ns_ = 0;
};

// The allocator for a device (created on first use). Host tensors use allocator(Device::cpu()).
Allocator& allocator(Device device);
// Page-locked host memory for device<->host copies (plain host memory in a CPU-only build or
// without a GPU: the same accounting, standing for pinned memory).
Allocator& pinned_allocator();

// Human-readable byte count: "1.50 GiB".
std::string format_bytes(int64_t bytes);

}  // namespace leantune
