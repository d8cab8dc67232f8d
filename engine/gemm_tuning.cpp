// The GEMM autotune's switch, caches and counters (engine/gemm_tuning.h). Host code only, so
// that the disk cache's parsing and writing are tested without a GPU.
//
// The disk file is one JSON object:
//   {"format": "leantune-gemm-tuning", "version": 1,
//    "devices": {"<GPU name|uuid|cuBLASLt version>": {"<problem>": {"rank": 2, "ms": 0.41}}}}
#include "engine/gemm_tuning.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "engine/check.h"
#include "engine/log.h"

namespace leantune::gemm_tuning {
namespace {

constexpr const char* kEnv = "LEANTUNE_GEMM_AUTOTUNE";
constexpr const char* kFormat = "leantune-gemm-tuning";
constexpr int kVersion = 1;
constexpr int kMaxRank = 64;  // cuBLASLt's candidate lists are requested with at most this many

using Json = nlohmann::json;

struct Entry {
  Choice choice;
  bool timed = false;
};

struct State {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, Entry> entries;
  Stats stats;
  bool disk_read = false;       // this process (since reset) has read the disk file
  bool warned_corrupt = false;  // one warning per process for a malformed file
  bool write_failed = false;    // one warning per process, then no more writes
  int64_t writes = 0;           // makes temporary names unique within the process
};

State& state() {
  static State s;
  return s;
}

// -1: not yet known; else a Mode.
std::atomic<int> g_mode{-1};

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The disk file's choices, by device and problem. Throws std::runtime_error with the reason when
// the text is not a cache file of this version.
std::map<std::pair<std::string, std::string>, Choice> parse_cache(const std::string& text) {
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::exception& e) {
    throw std::runtime_error(std::string("not JSON (") + e.what() + ")");
  }
  if (!doc.is_object() || doc.value("format", "") != kFormat)
    throw std::runtime_error(std::string("no \"format\": \"") + kFormat + "\"");
  if (!doc.contains("version") || doc["version"] != kVersion)
    throw std::runtime_error("version is not " + std::to_string(kVersion));
  if (!doc.contains("devices") || !doc["devices"].is_object())
    throw std::runtime_error("no \"devices\" object");
  std::map<std::pair<std::string, std::string>, Choice> out;
  for (const auto& [device, problems] : doc["devices"].items()) {
    if (!problems.is_object()) throw std::runtime_error("device \"" + device + "\" is no object");
    for (const auto& [problem, e] : problems.items()) {
      const std::string where = "entry \"" + problem + "\" of \"" + device + "\"";
      if (!e.is_object() || !e.contains("rank") || !e["rank"].is_number_integer() ||
          !e.contains("ms") || !e["ms"].is_number())
        throw std::runtime_error(where + " needs an integer \"rank\" and a number \"ms\"");
      const int64_t rank = e["rank"].get<int64_t>();
      const double ms = e["ms"].get<double>();
      if (rank < 0 || rank >= kMaxRank || !std::isfinite(ms) || ms < 0)
        throw std::runtime_error(where + " has rank " + std::to_string(rank) + ", ms " +
                                 std::to_string(ms));
      out[{device, problem}] = Choice{static_cast<int>(rank), ms};
    }
  }
  return out;
}

// The file's text; nullopt when it does not exist. Throws std::runtime_error when it exists but
// cannot be read.
std::optional<std::string> read_text(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot be opened");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot be read");
  return ss.str();
}

// The disk file's choices ({} when it is absent, or malformed: then one warning per process).
// Caller holds s.mu.
std::map<std::pair<std::string, std::string>, Choice> load_locked(
    State& s, const std::filesystem::path& path) {
  try {
    const std::optional<std::string> text = read_text(path);
    if (!text) return {};
    return parse_cache(*text);
  } catch (const std::exception& e) {
    if (!s.warned_corrupt) {
      s.warned_corrupt = true;
      log_message(LogLevel::kWarning, "leantune: warning: ignoring the GEMM tuning cache " +
                                          path.string() + ": " + e.what() +
                                          " (it is rewritten with this run's choices)");
    }
    return {};
  }
}

// Adds one choice to the disk file: read, merge, write a temporary file, rename it over the old
// one (readers see the old or the new file, never a partial one). Caller holds s.mu.
void write_locked(State& s, const std::string& device, const std::string& problem,
                  const Choice& c) {
  if (s.write_failed) return;
  const std::filesystem::path path = cache_path();
  if (path.empty()) return;
  Json devices = Json::object();
  for (const auto& [key, choice] : load_locked(s, path))
    devices[key.first][key.second] = Json{{"rank", choice.rank}, {"ms", choice.ms}};
  devices[device][problem] = Json{{"rank", c.rank}, {"ms", c.ms}};
  const Json doc = {{"format", kFormat}, {"version", kVersion}, {"devices", devices}};
  const std::filesystem::path tmp =
      path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(s.writes++);
  std::error_code ec;
  std::string why;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) {
    why = "cannot create " + path.parent_path().string() + ": " + ec.message();
  } else {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << doc.dump(1) << "\n";
      out.close();
      if (!out) why = "cannot write " + tmp.string();
    }
    if (why.empty()) {
      std::filesystem::rename(tmp, path, ec);
      if (ec) why = "cannot rename " + tmp.string() + ": " + ec.message();
    }
    if (!why.empty()) std::filesystem::remove(tmp, ec);
  }
  if (!why.empty()) {
    s.write_failed = true;
    log_message(LogLevel::kWarning, "leantune: warning: the GEMM tuning cache " + path.string() +
                                        " is not written (" + why +
                                        "); this run keeps its choices in memory");
  }
}

}  // namespace

Mode parse_mode(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "1") return Mode::kDisk;
  if (v == "0") return Mode::kOff;
  if (v == "memory") return Mode::kMemory;
  LT_THROW(ErrorKind::kInput, kEnv, "=", v, ": expected 0 (off), 1 (on, with the disk cache) or ",
           "memory (on, without it)");
}

Mode mode() {
  int m = g_mode.load(std::memory_order_acquire);
  if (m < 0) {
    m = static_cast<int>(parse_mode(std::getenv(kEnv)));
    int expected = -1;
    g_mode.compare_exchange_strong(expected, m);
    m = g_mode.load(std::memory_order_acquire);
  }
  return static_cast<Mode>(m);
}

void set_mode(Mode m) { g_mode.store(static_cast<int>(m), std::memory_order_release); }

std::optional<Choice> lookup(const std::string& device, const std::string& problem,
                             int candidates) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.disk_read && mode() == Mode::kDisk) {
    s.disk_read = true;
    const std::filesystem::path path = cache_path();
    if (!path.empty()) {
      for (const auto& [key, choice] : load_locked(s, path)) {
        if (s.entries.emplace(key, Entry{choice, true}).second) ++s.stats.disk_loaded;
      }
    }
  }
  auto it = s.entries.find({device, problem});
  if (it == s.entries.end() || it->second.choice.rank >= candidates) return std::nullopt;
  ++s.stats.hits;
  return it->second.choice;
}

void record(const std::string& device, const std::string& problem, const Choice& c, bool timed) {
  LT_CHECK(c.rank >= 0 && c.rank < kMaxRank, "gemm_tuning::record: rank ", c.rank);
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.entries[{device, problem}] = Entry{c, timed};
  if (!timed) {
    ++s.stats.untimed;
    return;
  }
  ++s.stats.tunings;
  if (mode() == Mode::kDisk) write_locked(s, device, problem, c);
}

void note_capture_fallback() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  ++s.stats.capture_fallbacks;
}

Stats stats() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.stats;
}

void reset() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.entries.clear();
  s.stats = Stats{};
  s.disk_read = false;
  s.warned_corrupt = false;
  s.write_failed = false;
}

std::filesystem::path cache_path() {
  const std::filesystem::path file = "gemm_tuning.json";
  if (const std::string d = env_or_empty("LEANTUNE_CACHE_DIR"); !d.empty()) return d / file;
  if (const std::string d = env_or_empty("XDG_CACHE_HOME"); !d.empty())
    return std::filesystem::path(d) / "leantune" / file;
  if (const std::string d = env_or_empty("HOME"); !d.empty())
    return std::filesystem::path(d) / ".cache" / "leantune" / file;
  return {};
}

}  // namespace leantune::gemm_tuning
