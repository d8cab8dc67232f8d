// Fuzz target for the safetensors validator: arbitrary bytes are treated as a whole file
// (length prefix, header, data section) and run through parse_safetensors_buffer, which is
// what SafetensorsFile::open runs on its mapping. A rejection must be an Error of kind kInput;
// any other outcome -- a crash, a sanitizer report, another exception, an internal Error, or an
// accepted file whose entries do not tile the data section -- aborts.
//
// Two builds from this file (tests/loaders/safetensors.cmake):
//   - fuzz_safetensors: libFuzzer + ASan + UBSan, only with clang and LEANTUNE_FUZZ=ON:
//       cmake -S . -B build-fuzz -DLEANTUNE_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++
//             -DCMAKE_C_COMPILER=clang -DLEANTUNE_CUDA=OFF  (one command line)
//       cmake --build build-fuzz --target fuzz_safetensors
//       build-fuzz/fuzz_safetensors -max_total_time=3600 tests/fuzz/corpus/safetensors
//     (copy the corpus first if new inputs should not land in the source tree).
//   - fuzz_safetensors_corpus: a plain driver (main below) that feeds every file of a corpus
//     directory to the same entry point; a ctest test runs it on the committed corpus. Files
//     named good_* must be accepted and files named bad_* rejected; other names (inputs the
//     fuzzer found) only have to be handled without a crash.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "engine/check.h"
#include "loaders/safetensors.h"

namespace {

// True when the bytes are a valid safetensors file; aborts on anything but a clean verdict.
bool accepts(const uint8_t* data, size_t size) {
  try {
    std::map<std::string, std::string> metadata;
    uint64_t header_size = 0;
    const auto entries =
        leantune::parse_safetensors_buffer(data, size, &metadata, "fuzz-input", &header_size);
    // The entries must tile the data section exactly, in order.
    uint64_t at = 0;
    for (const auto& e : entries) {
      if (e.begin != at || e.end < e.begin) std::abort();
      at = e.end;
    }
    if (at != size - 8 - header_size) std::abort();
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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  accepts(data, size);
  return 0;
}

#ifndef LEANTUNE_LIBFUZZER
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(argv[1])) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  int failures = 0, good = 0, bad = 0;
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string name = p.filename().string();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const bool ok = accepts(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (name.rfind("good_", 0) == 0) {
      ++good;
      if (!ok) {
        std::fprintf(stderr, "FAIL %s: rejected, expected accepted\n", name.c_str());
        ++failures;
      }
    } else if (name.rfind("bad_", 0) == 0) {
      ++bad;
      if (ok) {
        std::fprintf(stderr, "FAIL %s: accepted, expected rejected\n", name.c_str());
        ++failures;
      }
    }
  }
  std::printf("%zu inputs (%d good, %d bad), %d failures\n", files.size(), good, bad, failures);
  if (good == 0 || bad == 0) {
    std::fprintf(stderr, "corpus %s lacks good_* or bad_* files\n", argv[1]);
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
#endif
