// The GEMM autotune's host half: the switch, the cache of chosen algorithms (in memory, and on
// disk keyed by GPU and cuBLASLt version), and its counters. The timing itself runs in
// engine/ops_cuda_blas.cu, which asks here before it times a problem and records its choice.
//
// cuBLASLt's heuristic ranks its algorithms for a problem but its first choice is not always the
// fastest (0.82-0.91 of the best for some of Qwen2.5-1.5B's linears on an H200), so the first use
// of each problem (shape, dtypes, transposes, leading dimensions, alignment, bias epilogue,
// beta != 0, device) times the heuristic's candidates once and keeps the fastest one's rank.
// Different algorithms round differently (split-K, accumulation order), so a tuned product may
// differ from the heuristic's first choice in the last bits, within the op table's tolerance,
// and two processes may choose differently: LEANTUNE_GEMM_AUTOTUNE=0 (and every trainer under
// --deterministic_comm) runs the first choice always; the disk cache makes later processes on
// the same GPU reuse the first one's choices.
//
// LEANTUNE_GEMM_AUTOTUNE: "1" (default) tune, keep choices in memory and in the disk cache;
// "memory" tune without the disk cache; "0" no tuning. Read once per process.
// The disk cache: $LEANTUNE_CACHE_DIR/gemm_tuning.json, else $XDG_CACHE_HOME/leantune/, else
// $HOME/.cache/leantune/. Written atomically (a temporary file renamed over it); an unreadable
// or malformed file is ignored with one warning on stderr (and replaced on the next write); a
// failed write warns once and the process goes on with the in-memory cache.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace leantune::gemm_tuning {

enum class Mode { kOff, kMemory, kDisk };

// The mode a LEANTUNE_GEMM_AUTOTUNE value asks for (nullptr or "" = the default, kDisk).
// Throws Error(kInput) naming the variable for any other value.
Mode parse_mode(const char* value);
// The process's mode: set_mode's, else LEANTUNE_GEMM_AUTOTUNE's (read on first call).
Mode mode();
// Overrides the environment for the rest of the process (tests, benchmarks).
void set_mode(Mode m);

// One problem's choice: the heuristic rank (index into cuBLASLt's candidate list, best first)
// and its measured time per call in ms.
struct Choice {
  int rank = 0;
  double ms = 0.0;
};

struct Stats {
  int64_t tunings = 0;            // problems timed (record() calls with timed = true)
  int64_t hits = 0;               // lookups answered from the cache (memory or disk)
  int64_t disk_loaded = 0;        // entries read from the disk cache
  int64_t untimed = 0;            // problems left on rank 0 untimed (scratch too large, no memory)
  int64_t capture_fallbacks = 0;  // calls on a capturing stream that could not be tuned
};

// The cached choice of `problem` on `device` (a string naming the GPU and library version),
// when there is one whose rank is below `candidates`; counts a hit. In kDisk mode the disk cache
// is read on the first lookup of each device.
std::optional<Choice> lookup(const std::string& device, const std::string& problem, int candidates);
// Remembers a choice. timed: it was measured (counted as a tuning, written to the disk cache in
// kDisk mode); else it is kept in memory only (counted as untimed).
void record(const std::string& device, const std::string& problem, const Choice& c, bool timed);
void note_capture_fallback();

Stats stats();
// Forgets the in-memory choices, the counters and which devices' disk entries were read (the
// disk file stays). For tests.
void reset();

// Where the disk cache lives ("" when neither LEANTUNE_CACHE_DIR, XDG_CACHE_HOME nor HOME is
// set). Read from the environment on every call.
std::filesystem::path cache_path();

}  // namespace leantune::gemm_tuning
