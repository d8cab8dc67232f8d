// bench_allocator: replays allocation traces through the caching allocator under several
// settings side by side, and through a no-cache baseline (one raw malloc / cudaMalloc per
// request), and prints JSON: ns per alloc and per free, peak allocated, peak reserved,
// fragmentation (reserved minus allocated at the allocation peak), segments, retries.
//
//   bench_allocator [--device cpu|cuda] [--trace FILE.json] [--record FILE.json]
//                   [--settings NAME,NAME...] [--steps N] [--layers L] [--hidden H] [--seed S]
//
// Settings (engine/allocator.h AllocatorSettings): default; round_64 / round_4k (request
// rounding 64 B / 4 KiB instead of 512 B); split_large_always (a large-pool block splits
// whenever 512 B remain, not only above 1 MiB); split_large_never; small_pool_64k (only requests
// up to 64 KiB use the small pool); cross_stream_reuse (blocks freed on one stream serve
// another). --settings picks some (default: all). A trace from --memory_trace replays each
// event on its own stream id.
//
// Without --trace it generates a trace shaped like transformer training: parameters and
// gradients allocated once; per step a sequence length drawn from a long-tailed distribution,
// per-layer activations allocated in forward (some freed at once, the saved ones held) and
// freed in reverse order during backward, with backward temporaries in between. --record
// writes that trace in the allocator's trace JSON format (Allocator::trace_json), which
// --trace reads back.
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/cuda_api.h"
#include "engine/rng.h"
#include "loaders/fs_util.h"

using namespace leantune;

namespace {

struct Op {
  bool alloc;
  uint64_t id;
  int64_t size;
  MemTag tag;
  uint64_t stream = 0;
};

std::vector<Op> synthetic_trace(int steps, int layers, int64_t hidden, uint64_t seed) {
  std::vector<Op> ops;
  uint64_t next = 1;
  auto alloc = [&](int64_t size, MemTag tag) {
    ops.push_back({true, next, size, tag});
    return next++;
  };
  auto release = [&](uint64_t id) { ops.push_back({false, id, 0, MemTag::kOther}); };
  const int64_t inter = hidden * 27 / 8;
  std::vector<uint64_t> params;
  for (int l = 0; l < layers; ++l) {
    for (int64_t s : {hidden * hidden, hidden * hidden / 4, hidden * hidden / 4, hidden * hidden,
                      hidden * inter, hidden * inter, inter * hidden, hidden, hidden})
      params.push_back(alloc(s * 2, MemTag::kParam));
  }
  Generator gen(seed, RngPurpose::kTest);
  for (int step = 0; step < steps; ++step) {
    // Long-tailed sequence lengths: log-normal around 700 tokens, capped at 4096.
    PhiloxBlock b = gen.next_block();
    const double u1 = (b.w[0] + 1.0) / 4294967296.0, u2 = b.w[1] / 4294967296.0;
    const double z = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    const int64_t t = std::min<int64_t>(4096, std::max<int64_t>(16, std::exp(6.5 + 0.8 * z)));
    const int64_t th = t * hidden * 2, ti = t * inter * 2;
    std::vector<std::vector<uint64_t>> saved(layers);
    for (int l = 0; l < layers; ++l) {
      auto& s = saved[l];
      s.push_back(alloc(th, MemTag::kActivation));          // norm out
      s.push_back(alloc(th, MemTag::kActivation));          // q
      s.push_back(alloc(th / 4, MemTag::kActivation));      // k
      s.push_back(alloc(th / 4, MemTag::kActivation));      // v
      s.push_back(alloc(th, MemTag::kActivation));          // attn out
      s.push_back(alloc(t * 4 * 16, MemTag::kActivation));  // lse
      uint64_t tmp = alloc(th, MemTag::kWorkspace);         // o_proj out, consumed by residual
      s.push_back(alloc(th, MemTag::kActivation));          // residual
      release(tmp);
      s.push_back(alloc(ti, MemTag::kActivation));  // gate
      s.push_back(alloc(ti, MemTag::kActivation));  // up
      s.push_back(alloc(ti, MemTag::kActivation));  // swiglu out
      s.push_back(alloc(th, MemTag::kActivation));  // layer out
    }
    uint64_t logits = alloc(t * 1024 * 4, MemTag::kWorkspace);  // a chunked loss buffer
    release(logits);
    for (int l = layers - 1; l >= 0; --l) {
      uint64_t g1 = alloc(ti, MemTag::kActivation);
      uint64_t g2 = alloc(ti, MemTag::kActivation);
      release(g1);
      uint64_t g3 = alloc(th, MemTag::kActivation);
      release(g2);
      for (auto it = saved[l].rbegin(); it != saved[l].rend(); ++it) release(*it);
      release(g3);
    }
  }
  for (uint64_t p : params) release(p);
  return ops;
}

// The alloc and free events of a trace; Error(kInput) naming the file and event otherwise.
std::vector<Op> load_trace(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  LT_CHECK_INPUT(j.is_object() && j.contains("events") && j.at("events").is_array(), path,
                 ": no 'events' array (a trace from --memory_trace or --record)");
  std::vector<Op> ops;
  std::map<std::string, MemTag> tags;
  for (int i = 0; i < kNumMemTags; ++i)
    tags[mem_tag_name(static_cast<MemTag>(i))] = static_cast<MemTag>(i);
  const nlohmann::json& events = j.at("events");
  for (size_t i = 0; i < events.size(); ++i) {
    const nlohmann::json& e = events[i];
    try {
      const std::string kind = e.at("kind");
      if (kind != "alloc" && kind != "free") continue;
      const std::string tag = e.at("tag");
      LT_CHECK_INPUT(tags.count(tag), path, ": event ", i, ": unknown tag '", tag, "'");
      const int64_t size = e.at("size");
      LT_CHECK_INPUT(size >= 0, path, ": event ", i, ": negative size");
      ops.push_back(
          {kind == "alloc", e.at("id"), size, tags.at(tag), e.value("stream", uint64_t{0})});
    } catch (const nlohmann::json::exception& ex) {
      LT_THROW(ErrorKind::kInput, path, ": event ", i, ": ", ex.what());
    }
  }
  return ops;
}

struct NamedSettings {
  std::string name;
  AllocatorSettings settings;
};

std::vector<NamedSettings> all_settings() {
  std::vector<NamedSettings> v;
  v.push_back({"default", {}});
  AllocatorSettings s;
  s.round_to = 64;
  s.small_split_min = 64;
  v.push_back({"round_64", s});
  s = {};
  s.round_to = 4096;
  s.small_split_min = 4096;
  v.push_back({"round_4k", s});
  s = {};
  s.large_split_min = 511;
  v.push_back({"split_large_always", s});
  s = {};
  s.large_split_min = SIZE_MAX;
  v.push_back({"split_large_never", s});
  s = {};
  s.small_size = 64 << 10;
  v.push_back({"small_pool_64k", s});
  s = {};
  s.cross_stream_reuse = true;
  v.push_back({"cross_stream_reuse", s});
  return v;
}

struct Result {
  double ns_alloc = 0, ns_free = 0;
  int64_t peak_allocated = 0, peak_reserved = 0, fragmentation = 0, segments = 0, retries = 0;
  int64_t allocs = 0;
};

using Clock = std::chrono::steady_clock;

Result run_cached(const std::vector<Op>& ops, Allocator& alloc) {
  std::map<uint64_t, Block*> live;
  Result r;
  double ta = 0, tf = 0;
  int64_t nf = 0;
  alloc.reset_peak_stats();
  const AllocatorStats before = alloc.stats();
  for (const Op& op : ops) {
    if (op.alloc) {
      Stream s;
      s.device = alloc.device();
      s.id = op.stream;
      auto t0 = Clock::now();
      Block* b = alloc.allocate(static_cast<size_t>(op.size), op.tag, s);
      ta += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      live[op.id] = b;
      ++r.allocs;
    } else {
      auto it = live.find(op.id);
      if (it == live.end()) continue;
      auto t0 = Clock::now();
      alloc.free(it->second);
      tf += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      live.erase(it);
      ++nf;
    }
  }
  for (auto& [id, b] : live) alloc.free(b);
  AllocatorStats st = alloc.stats();
  r.ns_alloc = ta / std::max<int64_t>(r.allocs, 1);
  r.ns_free = tf / std::max<int64_t>(nf, 1);
  r.peak_allocated = st.allocated.peak;
  r.peak_reserved = st.reserved.peak;
  r.fragmentation = st.fragmentation_bytes();
  r.segments = st.num_segment_allocs - before.num_segment_allocs;
  r.retries = st.num_alloc_retries - before.num_alloc_retries;
  return r;
}

Result run_uncached(const std::vector<Op>& ops, MemoryBacking& backing) {
  std::map<uint64_t, std::pair<void*, int64_t>> live;
  Result r;
  double ta = 0, tf = 0;
  int64_t nf = 0, cur = 0;
  for (const Op& op : ops) {
    if (op.alloc) {
      auto t0 = Clock::now();
      void* p = backing.raw_alloc(static_cast<size_t>(std::max<int64_t>(op.size, 1)));
      ta += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      if (!p) {
        std::fprintf(stderr, "bench_allocator: baseline allocation of %lld bytes failed\n",
                     static_cast<long long>(op.size));
        std::exit(1);
      }
      live[op.id] = {p, op.size};
      cur += op.size;
      r.peak_allocated = std::max(r.peak_allocated, cur);
      ++r.allocs;
    } else {
      auto it = live.find(op.id);
      if (it == live.end()) continue;
      auto t0 = Clock::now();
      backing.raw_free(it->second.first, static_cast<size_t>(it->second.second));
      tf += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      cur -= it->second.second;
      live.erase(it);
      ++nf;
    }
  }
  for (auto& [id, p] : live) backing.raw_free(p.first, static_cast<size_t>(p.second));
  r.ns_alloc = ta / std::max<int64_t>(r.allocs, 1);
  r.ns_free = tf / std::max<int64_t>(nf, 1);
  r.peak_reserved = r.peak_allocated;
  r.segments = r.allocs;
  return r;
}

nlohmann::json to_json(const Result& r) {
  return {{"ns_per_alloc", r.ns_alloc},
          {"ns_per_free", r.ns_free},
          {"peak_allocated_bytes", r.peak_allocated},
          {"peak_reserved_bytes", r.peak_reserved},
          {"fragmentation_bytes", r.fragmentation},
          {"segment_allocs", r.segments},
          {"alloc_retries", r.retries},
          {"allocations", r.allocs}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", trace, record, only;
  int steps = 20, layers = 24;
  int64_t hidden = 896;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_allocator: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device")
      device = next();
    else if (a == "--trace")
      trace = next();
    else if (a == "--record")
      record = next();
    else if (a == "--settings")
      only = next();
    else if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--layers")
      layers = std::stoi(next());
    else if (a == "--hidden")
      hidden = std::stoll(next());
    else if (a == "--seed")
      seed = std::stoull(next());
    else {
      std::fprintf(stderr, "bench_allocator: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    Device dev = Device::parse(device);
    std::vector<Op> ops =
        trace.empty() ? synthetic_trace(steps, layers, hidden, seed) : load_trace(trace);
    std::vector<NamedSettings> chosen;
    for (const NamedSettings& ns : all_settings())
      if (only.empty() || ("," + only + ",").find("," + ns.name + ",") != std::string::npos)
        chosen.push_back(ns);
    LT_CHECK_INPUT(!chosen.empty(), "--settings ", only,
                   ": no known setting (default, round_64, round_4k, split_large_always, "
                   "split_large_never, small_pool_64k, cross_stream_reuse)");
    auto backing = [&] {
      return dev.is_cuda() ? cuda_make_device_backing(dev.index) : make_host_backing(false);
    };
    nlohmann::json settings = nlohmann::json::object();
    Result first;
    for (size_t k = 0; k < chosen.size(); ++k) {
      Allocator alloc(backing(), chosen[k].settings);
      const bool rec = k == 0 && !record.empty();
      if (rec) alloc.set_trace_enabled(true);
      // Warm run first (segments cached), then the measured run, as in steady-state training.
      run_cached(ops, alloc);
      if (rec) {
        std::ofstream(record) << alloc.trace_json();
        alloc.set_trace_enabled(false);
      }
      const Result r = run_cached(ops, alloc);
      if (k == 0) first = r;
      nlohmann::json j = to_json(r);
      j["fragmentation_fraction"] =
          r.peak_reserved > 0 ? static_cast<double>(r.fragmentation) / r.peak_reserved : 0.0;
      settings[chosen[k].name] = j;
    }
    std::unique_ptr<MemoryBacking> raw = backing();
    const Result base = run_uncached(ops, *raw);
    settings["no_cache"] = to_json(base);
    nlohmann::json out = {
        {"device", dev.str()},
        {"source", trace.empty() ? "synthetic" : trace},
        {"events", ops.size()},
        {"settings", settings},
        {"figures",
         {{"setting", chosen[0].name},
          {"allocator_ns_per_alloc", first.ns_alloc},
          {"allocator_ns_per_free", first.ns_free},
          {"allocator_baseline_ns_per_alloc", base.ns_alloc},
          {"allocator_baseline_ns_per_free", base.ns_free},
          {"allocator_fragmentation_fraction",
           first.peak_reserved > 0 ? static_cast<double>(first.fragmentation) / first.peak_reserved
                                   : 0.0}}}};
    std::printf("%s\n", out.dump(2).c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_allocator: %s\n", e.what());
    return exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allocator: %s\n", e.what());
    return 1;
  }
  return 0;
}
