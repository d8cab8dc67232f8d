// Fuzz target for the JSONL dataset reader: arbitrary bytes are a dataset file, read to the end
// by DatasetReader (loaders/dataset.h: format detection, per-line validation, typed records),
// once strict and once with skip_bad_lines and a vocabulary bound. A rejection must be an Error
// of kind kInput; anything else (a crash, a sanitizer report, another exception, an internal
// Error) aborts. The bytes go through a file because the reader streams from a path.
// Builds: fuzz_jsonl_corpus (ctest, over tests/fuzz/corpus/jsonl) and, with clang and
// LEANTUNE_FUZZ=ON, the libFuzzer target fuzz_jsonl (fuzz.cmake).
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "engine/check.h"
#include "loaders/dataset.h"
#include "tests/fuzz/fuzz_corpus_main.h"

namespace {
const std::string& scratch_path() {
  static const std::string p = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/fuzz_jsonl." + std::to_string(::getpid()) + ".jsonl";
  }();
  return p;
}

bool read_all(const leantune::DatasetReaderOptions& opt) {
  try {
    leantune::DatasetReader reader(scratch_path(), opt);
    leantune::Record r;
    while (reader.next(&r)) {
    }
    return true;
  } catch (const leantune::Error& e) {
    if (e.kind() != leantune::ErrorKind::kInput) {
      std::fprintf(stderr, "internal error on fuzz input: %s\n", e.what());
      std::abort();
    }
    return false;
  }
}
}  // namespace

bool fuzz_accepts(const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(scratch_path().c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  const bool strict = read_all({});
  leantune::DatasetReaderOptions lenient;
  lenient.skip_bad_lines = true;
  lenient.vocab_size = 1000;
  read_all(lenient);
  std::remove(scratch_path().c_str());
  return strict;
}
