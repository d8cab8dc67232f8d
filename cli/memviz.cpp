// Replays an allocator trace into the figures trainer_bin memviz draws (memory_trace.h).
#include "cli/memviz.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "loaders/fs_util.h"

namespace leantune {

namespace {

struct Live {
  int64_t size = 0;
  std::string tag, phase, site;
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

enum class Kind : uint8_t { kAlloc, kFree, kRetag, kSegmentAlloc, kSegmentFree, kOom };

// One validated event, compact: a trace of millions of events is replayed from these, never
// held as JSON.
struct Event {
  Kind kind;
  int8_t tag;
  bool has_segment;
  uint32_t phase;  // index into EventLog::phases
  uint32_t site;   // index into EventLog::sites ("" when the trace names none)
  uint64_t id;
  int64_t size, t_ns;
  uint64_t segment;
  int64_t offset;
};

// The events of a trace in order, validated one at a time (Error(kInput) naming the source and
// the event's index).
class EventLog {
 public:
  explicit EventLog(const std::string& source) : source_(source) {}
  void add(const nlohmann::json& e) {
    const size_t i = events.size();
    const std::string where = source_ + ": event " + std::to_string(i);
    LT_CHECK_INPUT(e.is_object(), where, ": not an object");
    const std::string kind = string_field(e, "kind", where);
    Event ev{};
    ev.id = static_cast<uint64_t>(int_field(e, "id", where, true));
    ev.size = int_field(e, "size", where, true);
    ev.t_ns = int_field(e, "t_ns", where, false);
    LT_CHECK_INPUT(ev.t_ns >= last_t_, where, ": t_ns goes back in time (", ev.t_ns, " after ",
                   last_t_, ")");
    last_t_ = ev.t_ns;
    int_field(e, "stream", where, true);
    ev.tag = static_cast<int8_t>(tag_index(string_field(e, "tag", where), where));
    ev.phase =
        intern(phase_ids_, phases, e.contains("phase") ? string_field(e, "phase", where) : "other");
    ev.site = intern(site_ids_, sites, e.contains("site") ? string_field(e, "site", where) : "");
    if (kind == "alloc") {
      ev.kind = Kind::kAlloc;
      if (e.contains("segment")) {
        ev.segment = static_cast<uint64_t>(int_field(e, "segment", where, true));
        ev.offset = int_field(e, "offset", where, true);
        ev.has_segment = true;
      }
    } else if (kind == "free") {
      ev.kind = Kind::kFree;
    } else if (kind == "retag") {
      ev.kind = Kind::kRetag;
    } else if (kind == "segment_alloc") {
      ev.kind = Kind::kSegmentAlloc;
    } else if (kind == "segment_free") {
      ev.kind = Kind::kSegmentFree;
    } else if (kind == "oom") {
      ev.kind = Kind::kOom;
    } else {
      LT_THROW(ErrorKind::kInput, where, ": unknown kind '", kind,
               "' (alloc, free, segment_alloc, segment_free, oom, retag)");
    }
    events.push_back(ev);
  }
  const std::string& where(size_t i) const {
    where_ = source_ + ": event " + std::to_string(i);
    return where_;
  }

  std::vector<Event> events;
  std::vector<std::string> phases, sites;

 private:
  static uint32_t intern(std::unordered_map<std::string, uint32_t>& ids,
                         std::vector<std::string>& names, const std::string& name) {
    const auto [it, added] = ids.emplace(name, static_cast<uint32_t>(names.size()));
    if (added) names.push_back(name);
    return it->second;
  }
  const std::string& source_;
  int64_t last_t_ = INT64_MIN;
  std::unordered_map<std::string, uint32_t> phase_ids_, site_ids_;
  mutable std::string where_;
};

// The analysis of a trace whose events are in `log` (`trace`: the rest of its fields).
nlohmann::json analyse(const nlohmann::json& trace, const EventLog& log, const std::string& source,
                       int64_t max_points) {
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
  const std::vector<Event>& events = log.events;
  LT_CHECK_INPUT(!events.empty(), source, ": the trace has no events");
  const auto n = static_cast<int64_t>(events.size());
  const int64_t stride = std::max<int64_t>(1, (n + max_points - 1) / max_points);
  auto tag_name = [](int tag) { return mem_tag_name(static_cast<MemTag>(tag)); };

  // First pass: the levels after each event, and the peak. Only the timeline's points keep
  // their per-tag levels (every stride-th event, the last, and the peak).
  struct Point {
    int64_t i, t;
    std::vector<int64_t> tags;
    int64_t reserved;
  };
  std::vector<Point> points;
  Point peak_point;
  std::unordered_map<uint64_t, int8_t> live;  // block -> tag
  int64_t peak = -1, peak_index = -1, ooms = 0, frees_before_trace = 0, retags_before_trace = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Event& e = events[static_cast<size_t>(i)];
    switch (e.kind) {
      case Kind::kAlloc:
        LT_CHECK_INPUT(live.emplace(e.id, e.tag).second, log.where(static_cast<size_t>(i)),
                       ": block ", e.id, " allocated twice");
        by_tag[e.tag] += e.size;
        break;
      case Kind::kFree:
        // A block allocated before recording began is part of the baseline.
        if (live.erase(e.id) == 0) ++frees_before_trace;
        by_tag[e.tag] -= e.size;
        break;
      case Kind::kRetag:
        // A block changing hands (a gradient buffer becoming .grad): its bytes move between tags.
        if (auto it = live.find(e.id); it != live.end()) {
          by_tag[it->second] -= e.size;
          it->second = e.tag;
          by_tag[e.tag] += e.size;
        } else {
          ++retags_before_trace;
        }
        break;
      case Kind::kSegmentAlloc:
        reserved += e.size;
        break;
      case Kind::kSegmentFree:
        reserved -= e.size;
        break;
      case Kind::kOom:
        ++ooms;
        break;
    }
    int64_t total = 0;
    for (int64_t v : by_tag) total += v;
    if (total > peak) {
      peak = total;
      peak_index = i;
      peak_point = {i, e.t_ns, by_tag, reserved};
    }
    if (i % stride == 0 || i == n - 1) points.push_back({i, e.t_ns, by_tag, reserved});
  }
  // The blocks and segments alive at the peak: the events replayed up to it.
  std::map<uint64_t, Live> live_at_peak;
  std::map<uint64_t, std::pair<int64_t, int64_t>> segments_at_peak;  // id -> (size, t_ns)
  for (int64_t i = 0; i <= peak_index; ++i) {
    const Event& e = events[static_cast<size_t>(i)];
    if (e.kind == Kind::kAlloc) {
      live_at_peak[e.id] = {
          e.size,    tag_name(e.tag), log.phases[e.phase], log.sites[e.site], e.t_ns,
          e.segment, e.offset,        e.has_segment};
    } else if (e.kind == Kind::kFree) {
      live_at_peak.erase(e.id);
    } else if (e.kind == Kind::kRetag) {
      if (auto it = live_at_peak.find(e.id); it != live_at_peak.end())
        it->second.tag = tag_name(e.tag);
    } else if (e.kind == Kind::kSegmentAlloc) {
      segments_at_peak[e.id] = {e.size, e.t_ns};
    } else if (e.kind == Kind::kSegmentFree) {
      segments_at_peak.erase(e.id);
    }
  }
  const std::string& peak_phase = log.phases[events[static_cast<size_t>(peak_index)].phase];

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
  nlohmann::json tl = nlohmann::json::array();
  bool peak_added = false;
  auto add_point = [&](const Point& p) {
    tl.push_back({{"i", p.i}, {"t", p.t}, {"tags", p.tags}, {"reserved", p.reserved}});
  };
  for (const Point& p : points) {
    if (!peak_added && peak_point.i <= p.i) {
      if (peak_point.i < p.i) add_point(peak_point);
      peak_added = true;
    }
    add_point(p);
  }
  out["timeline"] = tl;
  out["peak"] = {{"index", peak_index},       {"t", peak_point.t},
                 {"allocated", peak},         {"reserved", peak_point.reserved},
                 {"by_tag", peak_point.tags}, {"phase", peak_phase}};

  // Live blocks at the peak, largest first (those allocated before the trace are summarised
  // by the baseline).
  std::vector<std::pair<uint64_t, Live>> blocks(live_at_peak.begin(), live_at_peak.end());
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const auto& a, const auto& b) { return a.second.size > b.second.size; });
  nlohmann::json lb = nlohmann::json::array();
  for (const auto& [id, l] : blocks) {
    nlohmann::json b = {{"id", id},         {"size", l.size}, {"tag", l.tag},
                        {"phase", l.phase}, {"site", l.site}, {"t", l.t_ns}};
    if (l.has_segment) {
      b["segment"] = l.segment;
      b["offset"] = l.offset;
    }
    lb.push_back(b);
  }
  out["live_at_peak"] = lb;

  // Segments at the peak: those allocated within the trace, with their live blocks (grouped by
  // segment in one pass, largest first within each: linear in the blocks, not blocks x segments).
  std::unordered_map<uint64_t, std::vector<const Live*>> by_segment;
  for (const auto& [id, l] : blocks)
    if (l.has_segment && segments_at_peak.count(l.segment)) by_segment[l.segment].push_back(&l);
  nlohmann::json segs = nlohmann::json::array();
  for (const auto& [sid, st] : segments_at_peak) {
    nlohmann::json sb = nlohmann::json::array();
    int64_t used = 0;
    if (auto it = by_segment.find(sid); it != by_segment.end())
      for (const Live* l : it->second) {
        sb.push_back({{"offset", l->offset},
                      {"size", l->size},
                      {"tag", l->tag},
                      {"phase", l->phase},
                      {"site", l->site},
                      {"t", l->t_ns}});
        used += l->size;
      }
    segs.push_back({{"id", sid}, {"size", st.first}, {"allocated", used}, {"blocks", sb}});
  }
  out["segments_at_peak"] = segs;

  // Phase spans: runs of consecutive events in one phase ([t0, t1] of their first and last
  // event), the page's phase boundaries.
  nlohmann::json spans = nlohmann::json::array();
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    const uint32_t ph = events[static_cast<size_t>(i)].phase;
    while (j + 1 < n && events[static_cast<size_t>(j + 1)].phase == ph) ++j;
    spans.push_back({{"phase", log.phases[ph]},
                     {"t0", events[static_cast<size_t>(i)].t_ns},
                     {"t1", events[static_cast<size_t>(j)].t_ns}});
    i = j + 1;
  }
  out["phase_spans"] = spans;
  // When each recorded update ended (trace clock), from --memory_trace; absent in older traces.
  nlohmann::json ends = nlohmann::json::array();
  if (trace.contains("step_ends")) {
    const std::string where = source + ": step_ends";
    LT_CHECK_INPUT(trace.at("step_ends").is_array(), where, " must be an array");
    for (const nlohmann::json& s : trace.at("step_ends")) {
      LT_CHECK_INPUT(s.is_object(), where, ": an entry must be an object");
      ends.push_back(
          {{"step", int_field(s, "step", where, true)}, {"t", int_field(s, "t_ns", where, false)}});
    }
  }
  out["step_ends"] = ends;
  return out;
}

}  // namespace

nlohmann::json analyse_memory_trace(const nlohmann::json& trace, const std::string& source,
                                    int64_t max_points) {
  LT_CHECK_INPUT(trace.is_object(), source, ": a memory trace is a JSON object");
  LT_CHECK_INPUT(trace.contains("events") && trace.at("events").is_array(), source,
                 ": no 'events' array (write one with --memory_trace)");
  EventLog log(source);
  for (const nlohmann::json& e : trace.at("events")) log.add(e);
  return analyse(trace, log, source, max_points);
}

nlohmann::json analyse_memory_trace_file(const std::string& path, int64_t max_points) {
  EventLog log(path);
  const JsonArrayStream events{"events", [&log](nlohmann::json&& e) { log.add(e); }};
  const nlohmann::json trace =
      parse_json_strict(read_text_file(path), path, -1, nullptr, "JSON", &events);
  LT_CHECK_INPUT(trace.is_object(), path, ": a memory trace is a JSON object");
  LT_CHECK_INPUT(trace.contains("events") && trace.at("events").is_array(), path,
                 ": no 'events' array (write one with --memory_trace)");
  return analyse(trace, log, path, max_points);
}

}  // namespace leantune
