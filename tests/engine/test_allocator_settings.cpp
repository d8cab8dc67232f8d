// AllocatorSettings (request rounding, split thresholds, small-pool limit, cross-stream reuse)
// and the phase and segment placement recorded with each trace event (engine/mem_phase.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/allocator.h"
#include "engine/mem_phase.h"
#include "testing/testing.h"

namespace leantune {
namespace {

Stream host_stream(uint64_t id) {
  Stream s;
  s.id = id;
  return s;
}

TEST(AllocatorSettings, RoundingFollowsTheSetting) {
  for (size_t round : {size_t{1}, size_t{64}, size_t{512}, size_t{4096}}) {
    AllocatorSettings cfg;
    cfg.round_to = round;
    cfg.small_split_min = round;
    Allocator a(make_host_backing(false), cfg);
    for (size_t n : {size_t{1}, size_t{19}, size_t{4097}}) {
      Block* b = a.allocate(n, MemTag::kOther, host_stream(0));
      EXPECT_EQ(Allocator::block_size(b), (n + round - 1) / round * round) << round << " " << n;
      a.free(b);
    }
  }
}

TEST(AllocatorSettings, LargeSplitThresholdDecidesWhetherARemainderIsKept) {
  // A 3 MiB request takes a 20 MiB large segment; the 17 MiB rest is split off (default) or
  // stays in the block (never split).
  AllocatorSettings never;
  never.large_split_min = SIZE_MAX;
  Allocator split(make_host_backing(false)), whole(make_host_backing(false), never);
  Block* a = split.allocate(3 << 20, MemTag::kOther, host_stream(0));
  Block* b = whole.allocate(3 << 20, MemTag::kOther, host_stream(0));
  EXPECT_EQ(Allocator::block_size(a), size_t{3} << 20);
  EXPECT_EQ(Allocator::block_size(b), size_t{20} << 20);
  EXPECT_EQ(split.stats().allocated.current, 3 << 20);
  EXPECT_EQ(whole.stats().allocated.current, 20 << 20);
  split.free(a);
  whole.free(b);
}

TEST(AllocatorSettings, SmallPoolLimit) {
  // 100 KiB: small pool (2 MiB segment) by default, large pool (20 MiB) with a 64 KiB limit.
  AllocatorSettings cfg;
  cfg.small_size = 64 << 10;
  Allocator def(make_host_backing(false)), lim(make_host_backing(false), cfg);
  Block* a = def.allocate(100 << 10, MemTag::kOther, host_stream(0));
  Block* b = lim.allocate(100 << 10, MemTag::kOther, host_stream(0));
  EXPECT_EQ(def.stats().reserved.current, 2 << 20);
  EXPECT_EQ(lim.stats().reserved.current, 20 << 20);
  def.free(a);
  lim.free(b);
}

TEST(AllocatorSettings, CrossStreamReuse) {
  for (bool reuse : {false, true}) {
    AllocatorSettings cfg;
    cfg.cross_stream_reuse = reuse;
    Allocator a(make_host_backing(false), cfg);
    a.free(a.allocate(4096, MemTag::kOther, host_stream(1)));
    Block* b = a.allocate(4096, MemTag::kOther, host_stream(2));
    EXPECT_EQ(a.stats().num_segment_allocs, reuse ? 1 : 2) << reuse;
    a.free(b);
  }
}

TEST(AllocatorTrace, EventsCarryPhaseSegmentOffsetAndRetags) {
  Allocator a(make_host_backing(false));
  a.set_trace_enabled(true);
  Block *x, *y;
  {
    MemPhaseGuard fwd(MemPhaseKind::kForward, 5);
    x = a.allocate(1000, MemTag::kActivation, host_stream(0));
    y = a.allocate(1000, MemTag::kActivation, host_stream(0));
  }
  {
    MemPhaseGuard bwd(backward_phase_of(MemPhase{MemPhaseKind::kForward, 5}));
    a.retag(y, MemTag::kGrad);
    a.free(x);
  }
  a.free(y);
  const nlohmann::json ev = nlohmann::json::parse(a.trace_json())["events"];
  ASSERT_EQ(ev.size(), 6u);  // segment_alloc, alloc, alloc, retag, free, free
  EXPECT_EQ(ev[1]["phase"], "forward layer 5");
  EXPECT_EQ(ev[1]["segment"], ev[0]["id"]);
  EXPECT_EQ(ev[1]["offset"], 0);
  EXPECT_EQ(ev[2]["offset"], 1024);  // 1000 rounded to 512s
  EXPECT_EQ(ev[3]["kind"], "retag");
  EXPECT_EQ(ev[3]["tag"], "grad");
  EXPECT_EQ(ev[4]["phase"], "backward layer 5");
  EXPECT_EQ(ev[5]["phase"], "other");
  EXPECT_EQ(mem_phase_name({MemPhaseKind::kOptimizer, -1}), "optimizer");
  EXPECT_EQ(mem_phase_name({MemPhaseKind::kBackward, -1}), "backward");
}

}  // namespace
}  // namespace leantune
