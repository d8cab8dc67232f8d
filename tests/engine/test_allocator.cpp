#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/mem_phase.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "testing/functional.h"
#include "testing/testing.h"

namespace leantune {
namespace {

// A host backing whose events stay pending until the test completes them, so that the
// allocator's cross-stream rules can be tested without a GPU.
class MockBacking final : public MemoryBacking {
 public:
  Device device() const override { return Device::cpu(); }
  void* raw_alloc(size_t bytes) override {
    if (fail_next > 0) {
      --fail_next;
      return nullptr;
    }
    ++raw_allocs;
    return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  }
  void raw_free(void* p, size_t) override {
    ++raw_frees;
    std::free(p);
  }
  void* event_record(const Stream&) override {
    auto* ev = new bool(false);
    events.push_back(ev);
    return ev;
  }
  bool event_query(void* ev) override { return *static_cast<bool*>(ev); }
  void event_destroy(void* ev) override {
    events.erase(std::find(events.begin(), events.end(), static_cast<bool*>(ev)));
    delete static_cast<bool*>(ev);
  }
  void synchronize() override {}
  std::string name() const override { return "mock"; }
  void complete_all() {
    for (bool* e : events) *e = true;
  }
  int raw_allocs = 0;
  int raw_frees = 0;
  int fail_next = 0;
  std::vector<bool*> events;
};

struct Fixture {
  MockBacking* backing = new MockBacking;
  Allocator alloc{std::unique_ptr<MemoryBacking>(backing)};
  Stream s0{Device::cpu(), 0, nullptr};
  Stream s1{Device::cpu(), 1, nullptr};
};

TEST(Allocator, RoundsTo512AndReusesFreedBlock) {
  Fixture f;
  Block* a = f.alloc.allocate(100, MemTag::kActivation, f.s0);
  EXPECT_EQ(Allocator::block_size(a), 512u);
  void* pa = Allocator::block_ptr(a);
  f.alloc.free(a);
  Block* b = f.alloc.allocate(300, MemTag::kActivation, f.s0);
  EXPECT_EQ(Allocator::block_ptr(b), pa);  // the cached block came back
  EXPECT_EQ(f.backing->raw_allocs, 1);     // one 2 MiB small segment, no new cudaMalloc
  f.alloc.free(b);
}

// A window's peaks start at the current values and follow allocations after begin_window(); the
// whole-run peaks are untouched.
TEST(Allocator, WindowPeaksRestartAtBeginWindow) {
  Fixture f;
  Block* a = f.alloc.allocate(30 << 20, MemTag::kKVCache, f.s0);  // a 30 MiB segment of its own
  Block* b = f.alloc.allocate(1000, MemTag::kActivation, f.s0);
  f.alloc.free(a);
  f.alloc.empty_cache();
  f.alloc.begin_window();
  AllocatorStats st = f.alloc.stats();
  EXPECT_EQ(st.window_allocated.peak, 1024);
  EXPECT_EQ(st.window_reserved.peak, 2 << 20);
  EXPECT_EQ(st.allocated.peak, (30 << 20) + 1024);
  Block* c = f.alloc.allocate(3000, MemTag::kActivation, f.s0);
  f.alloc.free(c);
  st = f.alloc.stats();
  EXPECT_EQ(st.window_allocated.peak, 1024 + 3072);
  EXPECT_EQ(st.window_allocated.current, 1024);
  EXPECT_EQ(st.window_reserved.peak, 2 << 20);
  EXPECT_EQ(st.allocated.peak, (30 << 20) + 1024);
  f.alloc.free(b);
}

TEST(Allocator, SmallAndLargePoolsUseSeparateSegments) {
  Fixture f;
  Block* s = f.alloc.allocate(1 << 20, MemTag::kOther, f.s0);        // 1 MiB: small pool
  Block* l = f.alloc.allocate((1 << 20) + 1, MemTag::kOther, f.s0);  // large pool
  auto st = f.alloc.stats();
  EXPECT_EQ(st.segments, 2);
  EXPECT_EQ(st.reserved.current, (2 << 20) + (20 << 20));
  Block* big = f.alloc.allocate(64 << 20, MemTag::kOther, f.s0);  // >= 10 MiB: own segment
  EXPECT_EQ(f.alloc.stats().reserved.current, (2 << 20) + (20 << 20) + (64 << 20));
  f.alloc.free(s);
  f.alloc.free(l);
  f.alloc.free(big);
}

TEST(Allocator, SplitsAndCoalescesNeighbours) {
  Fixture f;
  Block* a = f.alloc.allocate(4096, MemTag::kOther, f.s0);
  Block* b = f.alloc.allocate(4096, MemTag::kOther, f.s0);
  Block* c = f.alloc.allocate(4096, MemTag::kOther, f.s0);
  // All three come from one 2 MiB segment, adjacent.
  EXPECT_EQ(static_cast<char*>(Allocator::block_ptr(b)),
            static_cast<char*>(Allocator::block_ptr(a)) + 4096);
  EXPECT_EQ(static_cast<char*>(Allocator::block_ptr(c)),
            static_cast<char*>(Allocator::block_ptr(b)) + 4096);
  EXPECT_EQ(f.alloc.stats().segments, 1);
  void* base = Allocator::block_ptr(a);
  f.alloc.free(a);
  f.alloc.free(c);
  f.alloc.free(b);  // merges with both neighbours and the tail remainder
  EXPECT_EQ(f.alloc.largest_free_block(), size_t{2} << 20);
  // The whole segment is one block again: a 1 MiB request lands at its start.
  Block* d = f.alloc.allocate(1 << 20, MemTag::kOther, f.s0);
  EXPECT_EQ(Allocator::block_ptr(d), base);
  f.alloc.free(d);
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.stats().reserved.current, 0);
  EXPECT_EQ(f.backing->raw_frees, 1);
}

TEST(Allocator, LargePoolSplitsOnlyAboveOneMiBRemainder) {
  Fixture f;
  // 19.5 MiB from a 20 MiB segment leaves 0.5 MiB: not split (remainder <= 1 MiB).
  Block* a = f.alloc.allocate((19 << 20) + (1 << 19), MemTag::kOther, f.s0);
  EXPECT_EQ(Allocator::block_size(a), size_t{20} << 20);
  f.alloc.free(a);
  // 2 MiB from the cached 20 MiB block leaves 18 MiB: split.
  Block* b = f.alloc.allocate(2 << 20, MemTag::kOther, f.s0);
  EXPECT_EQ(Allocator::block_size(b), size_t{2} << 20);
  EXPECT_EQ(f.alloc.largest_free_block(), size_t{18} << 20);
  f.alloc.free(b);
}

TEST(Allocator, ReuseIsBoundToTheFreeingStream) {
  Fixture f;
  Block* a = f.alloc.allocate(1000, MemTag::kOther, f.s0);
  void* pa = Allocator::block_ptr(a);
  f.alloc.free(a);
  Block* b = f.alloc.allocate(1000, MemTag::kOther, f.s1);
  EXPECT_NE(Allocator::block_ptr(b), pa);  // s1 may not take a block cached for s0
  EXPECT_EQ(f.alloc.stats().segments, 2);
  Block* c = f.alloc.allocate(1000, MemTag::kOther, f.s0);
  EXPECT_EQ(Allocator::block_ptr(c), pa);
  f.alloc.free(b);
  f.alloc.free(c);
}

// Debug poisoning must wait for the other streams: a pinned host block freed while a copy on
// another stream still reads it keeps its bytes until that stream's event completes, and is
// poisoned (0xff) only then.
TEST(Allocator, PoisonWaitsForPendingStreamUses) {
  Fixture f;
  f.alloc.set_poison(true);
  Block* a = f.alloc.allocate(4096, MemTag::kOther, f.s0);
  auto* pa = static_cast<unsigned char*>(Allocator::block_ptr(a));
  std::memset(pa, 0x11, 4096);
  f.alloc.record_stream(a, f.s1);  // e.g. an H2D copy on a side stream reads it
  f.alloc.free(a);
  ASSERT_EQ(f.backing->events.size(), 1u);
  for (int i = 0; i < 4096; i += 511) ASSERT_EQ(pa[i], 0x11) << i;  // still being read
  f.backing->complete_all();
  Block* b = f.alloc.allocate(600000, MemTag::kOther, f.s0);  // processes the events
  EXPECT_TRUE(f.backing->events.empty());
  for (int i = 0; i < 4096; i += 511) EXPECT_EQ(pa[i], 0xff) << i;  // really free: poisoned
  f.alloc.free(b);
}

TEST(Allocator, RecordStreamDelaysReuseUntilEventsComplete) {
  Fixture f;
  Block* a = f.alloc.allocate(1000, MemTag::kOther, f.s0);
  void* pa = Allocator::block_ptr(a);
  f.alloc.record_stream(a, f.s1);
  f.alloc.free(a);
  EXPECT_EQ(f.backing->events.size(), 1u);
  Block* b = f.alloc.allocate(1000, MemTag::kOther, f.s0);
  EXPECT_NE(Allocator::block_ptr(b), pa);  // still in use on s1
  f.backing->complete_all();
  Block* c = f.alloc.allocate(1000, MemTag::kOther, f.s0);
  EXPECT_EQ(Allocator::block_ptr(c), pa);  // event done: reusable
  f.alloc.free(b);
  f.alloc.free(c);
}

TEST(Allocator, StatsByTagAndPeak) {
  Fixture f;
  Block* p = f.alloc.allocate(10 << 20, MemTag::kParam, f.s0);
  Block* g = f.alloc.allocate(10 << 20, MemTag::kGrad, f.s0);
  Block* x = f.alloc.allocate(4 << 20, MemTag::kActivation, f.s0);
  auto st = f.alloc.stats();
  EXPECT_EQ(st.tag(MemTag::kParam).current, 10 << 20);
  EXPECT_EQ(st.tag(MemTag::kGrad).current, 10 << 20);
  EXPECT_EQ(st.tag(MemTag::kActivation).current, 4 << 20);
  EXPECT_EQ(st.allocated.current, 24 << 20);
  EXPECT_EQ(st.active_blocks, 3);
  f.alloc.free(x);
  st = f.alloc.stats();
  EXPECT_EQ(st.tag(MemTag::kActivation).current, 0);
  EXPECT_EQ(st.tag(MemTag::kActivation).peak, 4 << 20);
  EXPECT_EQ(st.allocated.peak, 24 << 20);
  // Fragmentation at the peak: 20 MiB segment held 4 MiB -> 16 MiB reserved but unallocated.
  EXPECT_EQ(st.fragmentation_bytes(), st.reserved_at_peak_allocated - (24 << 20));
  EXPECT_EQ(st.reserved_at_peak_allocated, (10 << 20) * 2 + (20 << 20));
  f.alloc.reset_peak_stats();
  EXPECT_EQ(f.alloc.stats().allocated.peak, 20 << 20);
  f.alloc.retag(g, MemTag::kOptimizer);
  EXPECT_EQ(f.alloc.stats().tag(MemTag::kGrad).current, 0);
  EXPECT_EQ(f.alloc.stats().tag(MemTag::kOptimizer).current, 10 << 20);
  f.alloc.free(p);
  f.alloc.free(g);
}

TEST(Allocator, RetriesAfterFreeingCacheThenSucceeds) {
  Fixture f;
  Block* a = f.alloc.allocate(30 << 20, MemTag::kOther, f.s0);
  f.alloc.free(a);  // cached, unsplit 30 MiB segment
  f.alloc.set_memory_limit(40 << 20);
  Block* b = f.alloc.allocate(32 << 20, MemTag::kOther, f.s0);  // needs the cache released
  EXPECT_EQ(f.alloc.stats().num_alloc_retries, 1);
  EXPECT_EQ(f.alloc.stats().reserved.current, 32 << 20);
  f.alloc.free(b);
}

TEST(Allocator, OutOfMemoryErrorStatesTheSituation) {
  Fixture f;
  f.alloc.set_memory_limit(80 << 20);
  Block* a = f.alloc.allocate(40 << 20, MemTag::kActivation, f.s0);  // own 40 MiB segment
  Block* p = f.alloc.allocate(12 << 20, MemTag::kParam, f.s0);       // own 12 MiB segment
  Block* c = f.alloc.allocate(8 << 20, MemTag::kActivation, f.s0);   // 20 MiB segment, 12 free
  try {
    f.alloc.allocate(30 << 20, MemTag::kActivation, f.s0);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
    const std::string m = e.what();
    EXPECT_NE(m.find("tried to allocate 30.00 MiB (activation)"), std::string::npos) << m;
    EXPECT_NE(m.find("allocated 60.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("reserved 72.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("limit 80.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("largest free block 12.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("activation 48.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("param 12.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("gradient_checkpointing"), std::string::npos) << m;
  }
  EXPECT_EQ(f.alloc.stats().num_ooms, 1);
  EXPECT_EQ(f.alloc.stats().num_alloc_retries, 1);
  f.alloc.free(a);
  f.alloc.free(p);
  f.alloc.free(c);
}

TEST(Allocator, BackingFailureAlsoRetriesOnce) {
  Fixture f;
  f.backing->fail_next = 1;
  Block* a = f.alloc.allocate(100, MemTag::kOther, f.s0);
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(f.alloc.stats().num_alloc_retries, 1);
  f.alloc.free(a);
}

TEST(Allocator, TraceRecordsEventsAsJson) {
  Fixture f;
  f.alloc.set_trace_enabled(true);
  Block* a = f.alloc.allocate(1000, MemTag::kWorkspace, f.s0);
  f.alloc.free(a);
  f.alloc.empty_cache();
  auto tr = f.alloc.trace();
  ASSERT_EQ(tr.size(), 4u);
  EXPECT_EQ(tr[0].kind, TraceEvent::kSegmentAlloc);
  EXPECT_EQ(tr[1].kind, TraceEvent::kAlloc);
  EXPECT_EQ(tr[1].size, 1024);
  EXPECT_EQ(tr[1].tag, MemTag::kWorkspace);
  EXPECT_EQ(tr[2].kind, TraceEvent::kFree);
  EXPECT_EQ(tr[2].id, tr[1].id);
  EXPECT_EQ(tr[3].kind, TraceEvent::kSegmentFree);
  auto j = nlohmann::json::parse(f.alloc.trace_json());
  EXPECT_EQ(j["device"], "cpu");
  ASSERT_EQ(j["events"].size(), 4u);
  EXPECT_EQ(j["events"][1]["kind"], "alloc");
  EXPECT_EQ(j["events"][1]["tag"], "workspace");
  EXPECT_LE(j["events"][0]["t_ns"].get<int64_t>(), j["events"][3]["t_ns"].get<int64_t>());
}

// Sites: a module's guard names forward allocations, the autograd node its backward ones
// ("<forward site>: <node>"); names are made only while a trace records them.
TEST(Allocator, TraceNamesTheAllocationSite) {
  Fixture f;
  EXPECT_FALSE(mem_sites_wanted());
  {
    MemSiteGuard off("mlp");
    EXPECT_EQ(current_mem_site(), 0);  // nobody records sites: no name interned
  }
  f.alloc.set_trace_enabled(true);
  EXPECT_TRUE(mem_sites_wanted());
  Block* a = nullptr;
  {
    MemSiteGuard site("mlp");
    EXPECT_EQ(mem_site_name(current_mem_site()), "mlp");
    a = f.alloc.allocate(1000, MemTag::kActivation, f.s0);
  }
  Block* b = f.alloc.allocate(1000, MemTag::kWorkspace, f.s0);
  EXPECT_EQ(f.alloc.trace_clock_ns() >= f.alloc.trace().back().time_ns, true);
  f.alloc.free(a);
  f.alloc.free(b);
  const auto j = nlohmann::json::parse(f.alloc.trace_json());
  std::vector<std::string> sites;
  for (const auto& e : j["events"])
    if (e["kind"] == "alloc") sites.push_back(e.value("site", std::string("-")));
  EXPECT_EQ(sites, (std::vector<std::string>{"mlp", "-"}));
  f.alloc.set_trace_enabled(false);
  EXPECT_FALSE(mem_sites_wanted());

  // Backward: a node created under "mlp" allocates under "mlp: <its name>".
  Allocator& cpu = allocator(Device::cpu());
  cpu.clear_trace();
  cpu.set_trace_enabled(true);
  Tensor x = Tensor::full({4, 3}, 1.0, DType::kF32, Device::cpu());
  x.set_requires_grad(true);
  Tensor y;
  {
    MemSiteGuard site("mlp");
    y = fn::sum(fn::mul(x, x));
  }
  y.backward();
  cpu.set_trace_enabled(false);
  const auto bj = nlohmann::json::parse(cpu.trace_json());
  cpu.clear_trace();
  bool backward_site = false;
  for (const auto& e : bj["events"])
    backward_site |= e.value("site", std::string()).rfind("mlp: ", 0) == 0;
  EXPECT_TRUE(backward_site) << bj.dump();
  EXPECT_EQ(mem_site_id(""), 0);
  EXPECT_EQ(mem_site_id("mlp"), mem_site_id("mlp"));
}

TEST(Allocator, TensorsAllocateThroughTheDeviceAllocatorWithTags) {
  Allocator& a = allocator(Device::cpu());
  const int64_t before = a.stats().tag(MemTag::kOptimizer).current;
  {
    Tensor t = Tensor::empty({1000}, DType::kF32, Device::cpu(), MemTag::kOptimizer);
    EXPECT_EQ(a.stats().tag(MemTag::kOptimizer).current - before, 4096);
    Tensor v = t.narrow(0, 10, 20);  // a view shares the block
    EXPECT_EQ(a.stats().tag(MemTag::kOptimizer).current - before, 4096);
  }
  EXPECT_EQ(a.stats().tag(MemTag::kOptimizer).current, before);
}

class AllocatorCuda : public ::testing::Test {};
TEST_F(AllocatorCuda, DeviceReuseSplitAndStats) {
  LT_SKIP_WITHOUT_CUDA();
  Allocator& a = allocator(Device::cuda(0));
  Stream s = current_stream(Device::cuda(0));
  Block* b1 = a.allocate(4096, MemTag::kActivation, s);
  void* p1 = Allocator::block_ptr(b1);
  a.free(b1);
  Block* b2 = a.allocate(4000, MemTag::kActivation, s);
  EXPECT_EQ(Allocator::block_ptr(b2), p1);
  Stream other = new_stream(Device::cuda(0));
  a.record_stream(b2, other);
  a.free(b2);
  other.synchronize();
  Block* b3 = a.allocate(4000, MemTag::kActivation, s);
  EXPECT_EQ(Allocator::block_ptr(b3), p1);  // event complete after synchronize
  a.free(b3);
  EXPECT_GT(a.stats().reserved.current, 0);
}

TEST_F(AllocatorCuda, OutOfMemoryOnDeviceLimit) {
  LT_SKIP_WITHOUT_CUDA();
  Allocator& a = allocator(Device::cuda(0));
  a.empty_cache();
  const size_t old = a.memory_limit();
  a.set_memory_limit(static_cast<size_t>(a.stats().reserved.current) + (64 << 20));
  EXPECT_THROW({ Tensor t = Tensor::empty({int64_t{128} << 20}, DType::kF32, Device::cuda(0)); },
               Error);
  a.set_memory_limit(old);
}

}  // namespace
}  // namespace leantune

namespace leantune {
namespace {

// A released Storage gives its bytes back and stays the same object: views and saved tensors
// over it see the restored memory; touching it while released is an Error, not a crash.
TEST(StorageRelease, ReleaseAndRestoreKeepTheTensorsValid) {
  Allocator& a = allocator(Device::cpu());
  const int64_t before = a.stats().tag(MemTag::kParam).current;
  Tensor w = Tensor::zeros({64, 32}, DType::kF32, Device::cpu(), MemTag::kParam);
  const Tensor view = w.narrow(0, 3, 2);
  EXPECT_EQ(a.stats().tag(MemTag::kParam).current - before, 64 * 32 * 4);
  w.storage()->release_memory();
  EXPECT_TRUE(w.storage()->memory_released());
  EXPECT_EQ(a.stats().tag(MemTag::kParam).current, before);
  EXPECT_THROW(w.data_ptr(), Error);
  EXPECT_THROW(view.to_f64(), Error);
  w.storage()->restore_memory();
  EXPECT_EQ(a.stats().tag(MemTag::kParam).current - before, 64 * 32 * 4);
  ops::fill(w, 2.5);
  for (double x : view.to_f64()) EXPECT_EQ(x, 2.5);
}

}  // namespace
}  // namespace leantune
