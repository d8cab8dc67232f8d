// Tokenizer throughput, one thread, printed as JSON: leantune's byte-level BPE on a few MB of
// deterministic mixed text (English prose-like words, code, numbers, CJK, emoji) with the Qwen2.5
// and Llama-3.2 tokenizers, and Hugging Face `tokenizers` on the same documents in the same run
// when a Python with the package is found ($LEANTUNE_PYTHON, else python3); skipped with a note
// otherwise. Python encodes each document with Tokenizer.encode in a loop, with
// TOKENIZERS_PARALLELISM=false and RAYON_NUM_THREADS=1. Both sides make one untimed pass first
// (so both BPE caches are warm) and report the best of the timed passes; the token counts and an
// id checksum are compared so a speed figure never hides a wrong tokenization.
//
//   bench_tokenizer [--tokenizers DIR] [--mb N] [--passes N]
// DIR defaults to tests/fixtures/tokenizers of this source tree.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loaders/tokenizer.h"

namespace {

using nlohmann::json;

// Deterministic on every platform (no std distributions).
struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

const char* kWords[] = {
    "the",        "of",          "and",         "to",           "in",         "is",
    "was",        "for",         "that",        "with",         "as",         "on",
    "by",         "model",       "training",    "memory",       "gradient",   "token",
    "layer",      "attention",   "weights",     "data",         "people",     "because",
    "through",    "between",     "however",     "although",     "important",  "different",
    "government", "information", "development", "university",   "experience", "international",
    "they'll",    "don't",       "it's",        "we've",        "I'm",        "you're",
    "can't",      "shouldn't",   "O'Neil",      "optimization", "throughput", "tokenizer",
    "benchmark",  "naïve",       "café",        "résumé",       "Zürich",     "São",
    "Paulo",      "München",     "Ærø",         "señor",        "jalapeño",   "coöperate"};
const char* kCjk[] = {"我", "们", "的", "是", "在", "中", "国", "人", "大", "学", "模", "型",
                      "训", "练", "内", "存", "日", "本", "語", "の", "テ", "キ", "ス", "ト",
                      "で", "す", "한", "국", "어", "입", "니", "다", "。", "、", "，"};
const char* kEmoji[] = {"😀",  "🎉", "👍🏽", "❤️", "🚀", "🤖", "👨‍👩‍👧",
                        "🇫🇷", "✨", "🔥"};
const char* kCode[] = {
    "def train(model, batch):\n    loss = model(batch).loss\n    loss.backward()\n",
    "for (int i = 0; i < n; ++i) {\n  y[i] += alpha * x[i];\n}\n",
    "    if (err != cudaSuccess) return -1;  // bail out\n",
    "{\"lr\": 2e-5, \"epochs\": 3, \"warmup_ratio\": 0.03, \"seed\": 42}\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;\n",
    "<div class=\"row\"><span>&nbsp;</span></div>\n",
    "\tx = [i ** 2 for i in range(10) if i % 2 == 0]\n"};

std::string make_document(Rng& rng) {
  std::string d;
  const size_t target = 400 + rng.below(3600);
  while (d.size() < target) {
    switch (rng.below(10)) {
      case 0:
      case 1:
      case 2:
      case 3: {  // a prose sentence
        const size_t n = 5 + rng.below(20);
        for (size_t i = 0; i < n; ++i) {
          std::string w = kWords[rng.below(std::size(kWords))];
          if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
          d += w;
          d += i + 1 == n ? (rng.below(4) == 0 ? "? " : ". ") : (rng.below(8) == 0 ? ", " : " ");
        }
        if (rng.below(5) == 0) d += "\n\n";
        break;
      }
      case 4:
      case 5:
        d += kCode[rng.below(std::size(kCode))];
        break;
      case 6: {  // numbers
        d += std::to_string(rng.below(100000)) + "." + std::to_string(rng.below(1000)) + " ";
        d += std::to_string(1900 + rng.below(200)) + "-0" + std::to_string(1 + rng.below(9));
        d += " $" + std::to_string(rng.below(1000000)) + " ";
        break;
      }
      case 7:
      case 8: {  // CJK
        const size_t n = 10 + rng.below(40);
        for (size_t i = 0; i < n; ++i) d += kCjk[rng.below(std::size(kCjk))];
        d += "\n";
        break;
      }
      default: {
        const size_t n = 1 + rng.below(4);
        for (size_t i = 0; i < n; ++i) d += kEmoji[rng.below(std::size(kEmoji))];
        d += rng.below(2) ? " " : "\n";
      }
    }
  }
  return d;
}

uint64_t fnv_ids(uint64_t h, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    h ^= static_cast<uint32_t>(id);
    h *= 1099511628211ULL;
  }
  return h;
}

struct Measure {
  double best_seconds = 0;
  int64_t tokens = 0;
  uint64_t checksum = 0;
};

Measure measure_leantune(const leantune::Tokenizer& tok, const std::vector<std::string>& docs,
                         int passes) {
  Measure m;
  for (int pass = 0; pass <= passes; ++pass) {
    int64_t tokens = 0;
    uint64_t h = 1469598103934665603ULL;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& d : docs) {
      const std::vector<int32_t> ids = tok.encode(d);
      tokens += static_cast<int64_t>(ids.size());
      h = fnv_ids(h, ids);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pass == 0) continue;  // warm-up
    if (m.best_seconds == 0 || s < m.best_seconds) m.best_seconds = s;
    m.tokens = tokens;
    m.checksum = h;
  }
  return m;
}

// The Python side: same warm-up, passes, token count and checksum; prints one JSON line.
const char* kPythonScript = R"PY(
import json, sys, time
import tokenizers
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = json.load(open(sys.argv[2], encoding="utf-8"))
passes = int(sys.argv[3])
best = None
for p in range(passes + 1):
    tokens = 0
    h = 1469598103934665603
    t0 = time.perf_counter()
    encs = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    s = time.perf_counter() - t0
    for ids in encs:
        tokens += len(ids)
        for i in ids:
            h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    if p > 0 and (best is None or s < best):
        best = s
print(json.dumps({"seconds": best, "tokens": tokens, "checksum": str(h),
                  "version": tokenizers.__version__}))
)PY";

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string run_capture(const std::string& cmd, int& status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  status = pclose(p);
  return out;
}

// A Python that imports tokenizers, or "" with the reason in `note`.
std::string find_python(std::string& note) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("LEANTUNE_PYTHON"); env && *env) candidates.push_back(env);
  candidates.push_back("python3");
  for (const auto& py : candidates) {
    int status = 0;
    run_capture(shell_quote(py) + " -c 'import tokenizers' 2>/dev/null", status);
    if (status == 0) return py;
  }
  note =
      "Python tokenizers not found (set LEANTUNE_PYTHON to a python with the tokenizers "
      "package); Hugging Face figures skipped";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string root =
      (fs::path(__FILE__).parent_path().parent_path() / "tests/fixtures/tokenizers").string();
  double mb = 4.0;
  int passes = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizers") {
      root = argv[i + 1];
    } else if (a == "--mb") {
      mb = std::atof(argv[i + 1]);
    } else if (a == "--passes") {
      passes = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "usage: %s [--tokenizers DIR] [--mb N] [--passes N]\n", argv[0]);
      return 2;
    }
  }

  Rng rng{0x9E3779B97F4A7C15ULL};
  std::vector<std::string> docs;
  size_t bytes = 0;
  while (bytes < static_cast<size_t>(mb * 1024 * 1024)) {
    docs.push_back(make_document(rng));
    bytes += docs.back().size();
  }

  std::string note;
  const std::string python = find_python(note);
  std::string docs_path;
  if (!python.empty()) {
    docs_path = (fs::temp_directory_path() /
                 ("bench_tokenizer_docs_" + std::to_string(::getpid()) + ".json"))
                    .string();
    std::ofstream(docs_path, std::ios::binary) << json(docs).dump();
  }

  json results = json::array();
  std::string hf_version;
  for (const char* name : {"qwen2.5", "llama3.2"}) {
    const std::string dir = (fs::path(root) / name).string();
    json r;
    r["tokenizer"] = name;
    try {
      const auto t0 = std::chrono::steady_clock::now();
      auto tok = leantune::Tokenizer::load(dir);
      r["load_seconds"] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const Measure m = measure_leantune(*tok, docs, passes);
      r["leantune_mb_per_s"] = static_cast<double>(bytes) / 1e6 / m.best_seconds;
      r["leantune_seconds"] = m.best_seconds;
      r["tokens"] = m.tokens;
      if (!python.empty()) {
        const std::string script_path = docs_path + ".py";
        std::ofstream(script_path) << kPythonScript;
        int status = 0;
        const std::string out = run_capture(
            "TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 " + shell_quote(python) + " " +
                shell_quote(script_path) + " " + shell_quote(dir + "/tokenizer.json") + " " +
                shell_quote(docs_path) + " " + std::to_string(passes),
            status);
        fs::remove(script_path);
        if (status == 0) {
          const json py = json::parse(out);
          const double s = py["seconds"].get<double>();
          hf_version = py["version"];
          r["hf_tokenizers_mb_per_s"] = static_cast<double>(bytes) / 1e6 / s;
          r["hf_tokenizers_seconds"] = s;
          r["speedup_vs_hf"] = s / m.best_seconds;
          r["ids_match_hf"] = py["tokens"].get<int64_t>() == m.tokens &&
                              py["checksum"].get<std::string>() == std::to_string(m.checksum);
        } else {
          r["hf_tokenizers_note"] =
              "the Python benchmark failed (status " + std::to_string(status) + ")";
        }
      }
    } catch (const std::exception& e) {
      r["error"] = e.what();
    }
    results.push_back(r);
  }
  if (!docs_path.empty()) fs::remove(docs_path);

  json report;
  report["bench"] = "tokenizer";
  report["threads"] = 1;
  report["text_bytes"] = bytes;
  report["documents"] = docs.size();
  report["timed_passes"] = passes;
  report["results"] = results;
  if (python.empty()) {
    report["hf_tokenizers"] = note;
  } else {
    report["hf_tokenizers"] = "tokenizers " + hf_version + " via " + python;
  }
  std::printf("%s\n", report.dump(2).c_str());
  return 0;
}
