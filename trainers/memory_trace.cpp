// Replays an allocator trace into the figures trainer_bin memviz draws (memory_trace.h).
#include "trainers/memory_trace.h"

#include <algorithm>
#include <map>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"

namespace leantune {

namespace {

struct Live {
  int64_t size = 0;
  std::string tag, phase;
  int64_t t_ns = 0;
  uint64_t segment = 0;
  int64_t offset = 0;
  bool has_segment = false;
};

int tag_index(const std::string& tag, const std::string& where) {
  for (int i = 0; i < kNumMemTags; ++i)
    if (tag == mem_tag_name(static_cast<MemTag>(i))) return i;
  LT_THROW(ErrorKind::kInput, where, ": unknown tag '", tag, "'");
}

// A required integer field (>= 0 where asked).
int64_t int_field(const nlohmann::json& e, const char* key, const std::string& where,
                  bool non_negative) {
  LT_CHECK_INPUT(e.contains(key), where, ": missing '", key, "'");
  const nlohmann::json& v = e.at(key);
  LT_CHECK_INPUT(v.is_number_integer(), where, ": '", key, "' must be an integer, got ", v.dump());
  const int64_t x =
      v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
  LT_CHECK_INPUT(!non_negative || x >= 0, where, ": '", key, "' must be >= 0, got ", x);
  return x;
}

std::string string_field(const nlohmann::json& e, const char* key, const std::string& where) {
  LT_CHECK_INPUT(e.contains(key), where, ": missing '", key, "'");
  LT_CHECK_INPUT(e.at(key).is_string(), where, ": '", key, "' must be a string");
  return e.at(key).get<std::string>();
}

}  // namespace

nlohmann::json analyse_memory_trace(const nlohmann::json& trace, const std::string& source,
                                    int64_t max_points) {
  LT_CHECK_INPUT(trace.is_object(), source, ": a memory trace is a JSON object");
  LT_CHECK_INPUT(trace.contains("events") && trace.at("events").is_array(), source,
                 ": no 'events' array (write one with --memory_trace)");
  const nlohmann::json& events = trace.at("events");

  std::vector<int64_t> by_tag(kNumMemTags, 0);
  int64_t reserved = 0, baseline_reserved = 0;
  if (trace.contains("baseline")) {
    const nlohmann::json& b = trace.at("baseline");
    const std::string where = source + ": baseline";
    LT_CHECK_INPUT(b.is_object(), where, " must be an object");
    baseline_reserved = reserved = int_field(b, "reserved", where, true);
    if (b.contains("by_tag")) {
      LT_CHECK_INPUT(b.at("by_tag").is_object(), where, ": 'by_tag' must be an object");
      for (auto it = b.at("by_tag").begin(); it != b.at("by_tag").end(); ++it) {
        LT_CHECK_INPUT(it.value().is_number_integer(), where, ": by_tag.", it.key(),
                       " must be an integer");
        by_tag[tag_index(it.key(), where)] = it.value().get<int64_t>();
      }
    }
  }
  std::vector<int64_t> baseline_by_tag = by_tag;

  // Per event: time, allocated per tag, reserved.
  std::vector<int64_t> times;
  std::vector<std::vector<int64_t>> levels;
  std::vector<int64_t> reserved_at;
  std::map<uint64_t, Live> live;
  std::map<uint64_t, std::pair<int64_t, int64_t>> segments;  // id -> (size, t_ns allocated)
  int64_t peak = -1, peak_index = -1, peak_reserved = 0, ooms = 0, frees_before_trace = 0,
          retags_before_trace = 0;
  std::map<uint64_t, Live> live_at_peak;
  std::map<uint64_t, std::pair<int64_t, int64_t>> segments_at_peak;
  int64_t last_t = INT64_MIN;
  for (size_t i = 0; i < events.size(); ++i) {
    const nlohmann::json& e = events[i];
    const std::string where = source + ": event " + std::to_string(i);
    LT_CHECK_INPUT(e.is_object(), where, ": not an object");
    const std::string kind = string_field(e, "kind", where);
    const auto id = static_cast<uint64_t>(int_field(e, "id", where, true));
    const int64_t size = int_field(e, "size", where, true);
    const int64_t t = int_field(e, "t_ns", where, false);
    LT_CHECK_INPUT(t >= last_t, where, ": t_ns goes back in time (", t, " after ", last_t, ")");
    last_t = t;
    int_field(e, "stream", where, true);
    const int tag = tag_index(string_field(e, "tag", where), where);
    const std::string phase = e.contains("phase") ? string_field(e, "phase", where) : "other";
    if (kind == "alloc") {
      Live l{size, mem_tag_name(static_cast<MemTag>(tag)), phase, t, 0, 0, false};
      if (e.contains("segment")) {
        l.segment = static_cast<uint64_t>(int_field(e, "segment", where, true));
        l.offset = int_field(e, "offset", where, true);
        l.has_segment = true;
      }
      LT_CHECK_INPUT(!live.count(id), where, ": block ", id, " allocated twice");
      live[id] = l;
      by_tag[tag] += size;
    } else if (kind == "free") {
      auto it = live.find(id);
      if (it == live.end()) {
        ++frees_before_trace;  // allocated before recording began: part of the baseline
      } else {
        live.erase(it);
      }
      by_tag[tag] -= size;
    } else if (kind == "retag") {
      // A block changing hands (a gradient buffer becoming .grad): its bytes move between tags.
      auto it = live.find(id);
      if (it != live.end()) {
        by_tag[tag_index(it->second.tag, where)] -= size;
        it->second.tag = mem_tag_name(static_cast<MemTag>(tag));
        by_tag[tag] += size;
      } else {
        ++retags_before_trace;
      }
    } else if (kind == "segment_alloc") {
      segments[id] = {size, t};
      reserved += size;
    } else if (kind == "segment_free") {
      segments.erase(id);
      reserved -= size;
    } else if (kind == "oom") {
      ++ooms;
    } else {
      LT_THROW(ErrorKind::kInput, where, ": unknown kind '", kind,
               "' (alloc, free, segment_alloc, segment_free, oom, retag)");
    }
    int64_t total = 0;
    for (int64_t v : by_tag) total += v;
    times.push_back(t);
    levels.push_back(by_tag);
    reserved_at.push_back(reserved);
    if (total > peak) {
      peak = total;
      peak_index = static_cast<int64_t>(i);
      peak_reserved = reserved;
    }
  }
  LT_CHECK_INPUT(!events.empty(), source, ": the trace has no events");
  // The blocks and segments alive at the peak: the (validated) events replayed up to it.
  for (int64_t i = 0; i <= peak_index; ++i) {
    const nlohmann::json& e = events[i];
    const std::string kind = e.at("kind");
    const auto id = e.at("id").get<uint64_t>();
    if (kind == "alloc") {
      live_at_peak[id] = {e.at("size").get<int64_t>(),
                          e.at("tag").get<std::string>(),
                          e.value("phase", "other"),
                          e.at("t_ns").get<int64_t>(),
                          e.value("segment", uint64_t{0}),
                          e.value("offset", int64_t{0}),
                          e.contains("segment")};
    } else if (kind == "free") {
      live_at_peak.erase(id);
    } else if (kind == "retag") {
      if (auto it = live_at_peak.find(id); it != live_at_peak.end())
        it->second.tag = e.at("tag").get<std::string>();
    } else if (kind == "segment_alloc") {
      segments_at_peak[id] = {e.at("size").get<int64_t>(), e.at("t_ns").get<int64_t>()};
    } else if (kind == "segment_free") {
      segments_at_peak.erase(id);
    }
  }

  nlohmann::json out;
  out["source"] = source;
  out["device"] = trace.value("device", "?");
  out["steps"] = trace.value("steps", nlohmann::json::array());
  out["events"] = events.size();
  out["ooms"] = ooms;
  out["frees_of_blocks_from_before_the_trace"] = frees_before_trace;
  // Blocks from before the trace that changed tag: the per-tag split of the baseline is then
  // off by their size (the total is not).
  out["retags_of_blocks_from_before_the_trace"] = retags_before_trace;
  nlohmann::json tags = nlohmann::json::array();
  for (int i = 0; i < kNumMemTags; ++i) tags.push_back(mem_tag_name(static_cast<MemTag>(i)));
  out["tags"] = tags;
  out["baseline"] = {{"by_tag", baseline_by_tag}, {"reserved", baseline_reserved}};

  // Timeline: every event when few, else evenly spaced ones plus the peak.
  const auto n = static_cast<int64_t>(events.size());
  const int64_t stride = std::max<int64_t>(1, (n + max_points - 1) / max_points);
  nlohmann::json tl = nlohmann::json::array();
  for (int64_t i = 0; i < n; ++i) {
    if (i % stride != 0 && i != peak_index && i != n - 1) continue;
    tl.push_back({{"i", i}, {"t", times[i]}, {"tags", levels[i]}, {"reserved", reserved_at[i]}});
  }
  out["timeline"] = tl;
  out["peak"] = {{"index", peak_index},
                 {"t", times[peak_index]},
                 {"allocated", peak},
                 {"reserved", peak_reserved},
                 {"by_tag", levels[peak_index]},
                 {"phase", events[peak_index].value("phase", "other")}};

  // Live blocks at the peak, largest first (those allocated before the trace are summarised
  // by the baseline).
  std::vector<std::pair<uint64_t, Live>> blocks(live_at_peak.begin(), live_at_peak.end());
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const auto& a, const auto& b) { return a.second.size > b.second.size; });
  nlohmann::json lb = nlohmann::json::array();
  for (const auto& [id, l] : blocks) {
    nlohmann::json b = {
        {"id", id}, {"size", l.size}, {"tag", l.tag}, {"phase", l.phase}, {"t", l.t_ns}};
    if (l.has_segment) {
      b["segment"] = l.segment;
      b["offset"] = l.offset;
    }
    lb.push_back(b);
  }
  out["live_at_peak"] = lb;

  // Segments at the peak: those allocated within the trace, with their live blocks.
  nlohmann::json segs = nlohmann::json::array();
  for (const auto& [sid, st] : segments_at_peak) {
    nlohmann::json sb = nlohmann::json::array();
    int64_t used = 0;
    for (const auto& [id, l] : blocks)
      if (l.has_segment && l.segment == sid) {
        sb.push_back({{"offset", l.offset}, {"size", l.size}, {"tag", l.tag}, {"phase", l.phase}});
        used += l.size;
      }
    segs.push_back({{"id", sid}, {"size", st.first}, {"allocated", used}, {"blocks", sb}});
  }
  out["segments_at_peak"] = segs;
  return out;
}

}  // namespace leantune
