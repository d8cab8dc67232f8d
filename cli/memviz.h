// Reading and analysing an allocator trace (the JSON of --memory_trace, or any
// Allocator::trace_json()), for trainer_bin memviz.
//
// The trace is replayed event by event: allocated bytes per tag (plus the baseline recorded
// before tracing began), reserved bytes, and the live blocks. The result holds what the HTML
// page shows: the timeline (downsampled to at most max_points, the peak always kept), the
// peak, the live blocks at the peak (largest first, with the phase that allocated them),
// reserved vs allocated over time, and each segment's blocks at the peak.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace leantune {

// Validates and analyses a parsed trace; Error(kInput) naming `source` and the event index for
// anything malformed (wrong kind, missing or mistyped field, unknown tag, negative size).
nlohmann::json analyse_memory_trace(const nlohmann::json& trace, const std::string& source,
                                    int64_t max_points = 4000);
// The same from a trace file, its events streamed one at a time (never held as JSON): time and
// memory linear in the events.
nlohmann::json analyse_memory_trace_file(const std::string& path, int64_t max_points = 4000);

// The self-contained HTML page (inline script and SVG, no network access) for an analysis.
std::string memory_trace_html(const nlohmann::json& analysis);

}  // namespace leantune
