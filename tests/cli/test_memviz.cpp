// analyse_memory_trace (cli/memviz.h) on hand-built traces whose peak, live blocks,
// segments and per-tag levels are known; malformed traces are input errors naming the event.
#include <gtest/gtest.h>

#include "cli/memviz.h"
#include "engine/check.h"
#include "testing/testing.h"

namespace leantune {
namespace {

nlohmann::json ev(const char* kind, uint64_t id, int64_t size, const char* tag, int64_t t,
                  const char* phase = "other") {
  return {{"kind", kind}, {"id", id},  {"size", size},  {"tag", tag},
          {"stream", 0},  {"t_ns", t}, {"phase", phase}};
}

TEST(MemoryTrace, PeakLiveBlocksSegmentsAndBaseline) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back(ev("segment_alloc", 1, 4096, "other", 0));
  auto a = ev("alloc", 10, 1024, "activation", 1, "forward layer 0");
  a["segment"] = 1;
  a["offset"] = 0;
  auto b = ev("alloc", 11, 2048, "activation", 2, "forward layer 1");
  b["segment"] = 1;
  b["offset"] = 1024;
  events.push_back(a);
  events.push_back(b);
  events.push_back(ev("retag", 10, 1024, "grad", 3, "backward layer 1"));
  events.push_back(ev("free", 11, 2048, "activation", 4, "backward layer 1"));
  events.push_back(ev("free", 99, 512, "param", 5));  // allocated before the trace
  nlohmann::json trace = {{"device", "cpu"},
                          {"events", events},
                          {"steps", {1, 1}},
                          {"baseline", {{"reserved", 8192}, {"by_tag", {{"param", 512}}}}}};
  const nlohmann::json r = analyse_memory_trace(trace, "t.json");
  EXPECT_EQ(r["peak"]["allocated"], 512 + 1024 + 2048);
  EXPECT_EQ(r["peak"]["index"], 2);
  EXPECT_EQ(r["peak"]["reserved"], 8192 + 4096);
  EXPECT_EQ(r["peak"]["phase"], "forward layer 1");
  ASSERT_EQ(r["live_at_peak"].size(), 2u);
  EXPECT_EQ(r["live_at_peak"][0]["size"], 2048);  // largest first
  EXPECT_EQ(r["live_at_peak"][1]["phase"], "forward layer 0");
  ASSERT_EQ(r["segments_at_peak"].size(), 1u);
  EXPECT_EQ(r["segments_at_peak"][0]["allocated"], 3072);
  EXPECT_EQ(r["frees_of_blocks_from_before_the_trace"], 1);
  // The last point: the retagged block counts as grad, the param block is gone.
  const nlohmann::json last = r["timeline"].back()["tags"];
  EXPECT_EQ(last[0], 0);     // param
  EXPECT_EQ(last[1], 1024);  // grad
  EXPECT_EQ(last[3], 0);     // activation
}

TEST(MemoryTrace, TimelineIsDownsampledButKeepsThePeak) {
  nlohmann::json events = nlohmann::json::array();
  for (int i = 0; i < 71; ++i) events.push_back(ev("alloc", i, 512, "activation", i));
  for (int i = 0; i < 71; ++i) events.push_back(ev("free", i, 512, "activation", 71 + i));
  const nlohmann::json r = analyse_memory_trace({{"events", events}}, "t.json", 10);
  EXPECT_LE(r["timeline"].size(), 12u);
  bool has_peak = false;
  for (const auto& p : r["timeline"]) has_peak = has_peak || p["i"] == 70;
  EXPECT_TRUE(has_peak);
  EXPECT_EQ(r["peak"]["allocated"], 71 * 512);
}

TEST(MemoryTrace, SitesPhaseSpansAndUpdateEnds) {
  auto a = ev("alloc", 1, 100, "activation", 10, "forward layer 0");
  a["site"] = "mlp";
  auto b = ev("alloc", 2, 300, "grad", 20, "backward layer 0");
  b["site"] = "mlp: LinearBackward";
  nlohmann::json events = {a, ev("alloc", 3, 50, "workspace", 15, "forward layer 0"), b,
                           ev("free", 3, 50, "workspace", 30, "backward layer 0"),
                           ev("alloc", 4, 10, "optimizer", 40, "optimizer")};
  const nlohmann::json r = analyse_memory_trace(
      {{"events", events},
       {"step_ends", {{{"step", 1}, {"t_ns", 45}}, {{"step", 2}, {"t_ns", 90}}}}},
      "t.json");
  // The peak (450 B) is at the third event: blocks of 300, 100 and 50 bytes are live.
  ASSERT_EQ(r["live_at_peak"].size(), 3u);
  EXPECT_EQ(r["live_at_peak"][0]["site"], "mlp: LinearBackward");  // largest first
  EXPECT_EQ(r["live_at_peak"][1]["site"], "mlp");
  EXPECT_EQ(r["live_at_peak"][2]["site"], "");  // none recorded
  const nlohmann::json want_spans = {{{"phase", "forward layer 0"}, {"t0", 10}, {"t1", 15}},
                                     {{"phase", "backward layer 0"}, {"t0", 20}, {"t1", 30}},
                                     {{"phase", "optimizer"}, {"t0", 40}, {"t1", 40}}};
  EXPECT_EQ(r["phase_spans"], want_spans);
  const nlohmann::json want_ends = {{{"step", 1}, {"t", 45}}, {{"step", 2}, {"t", 90}}};
  EXPECT_EQ(r["step_ends"], want_ends);
  EXPECT_EQ(analyse_memory_trace({{"events", events}}, "t.json")["step_ends"].size(), 0u);
  try {
    analyse_memory_trace({{"events", events}, {"step_ends", {{{"step", "one"}}}}}, "t.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: step_ends: 'step' must be an integer"),
              std::string::npos)
        << e.what();
  }
}

TEST(MemoryTrace, MalformedTracesNameTheEvent) {
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {nlohmann::json::array(), "a memory trace is a JSON object"},
      {{{"events", 3}}, "no 'events' array"},
      {{{"events", nlohmann::json::array()}}, "no events"},
      {{{"events", nlohmann::json::array({ev("alloc", 1, -5, "param", 0)})}},
       "event 0: 'size' must be >= 0"},
      {{{"events", {ev("alloc", 1, 5, "param", 3), ev("free", 1, 5, "param", 2)}}},
       "event 1: t_ns goes back in time"},
      {{{"events", {ev("alloc", 1, 5, "param", 0), ev("alloc", 1, 5, "param", 1)}}},
       "event 1: block 1 allocated twice"},
  };
  for (const auto& [trace, expect] : cases) {
    try {
      analyse_memory_trace(trace, "t.json");
      ADD_FAILURE() << "no error for " << trace.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("t.json"), std::string::npos) << e.what();
    }
  }
}

TEST(MemoryTrace, PageIsSelfContainedAndCannotBeClosedByData) {
  nlohmann::json events = nlohmann::json::array({ev("alloc", 1, 512, "param", 0, "</script><b>")});
  const std::string html = memory_trace_html(analyse_memory_trace({{"events", events}}, "t"));
  EXPECT_EQ(html.find("</script><b>"), std::string::npos);
  EXPECT_NE(html.find("<\\/script><b>"), std::string::npos);
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_NE(html.find("id=\"peak-marker\""), std::string::npos);
}

}  // namespace
}  // namespace leantune
