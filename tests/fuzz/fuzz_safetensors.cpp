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
//   - fuzz_safetensors_corpus: the plain corpus driver of fuzz_corpus_main.h over the committed
//     corpus: files named good_* must be accepted and files named bad_* rejected; other names
//     (inputs the fuzzer found) only have to be handled without a crash.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "engine/check.h"
#include "loaders/safetensors.h"
#include "tests/fuzz/fuzz_corpus_main.h"

// True when the bytes are a valid safetensors file; aborts on anything but a clean verdict.
bool fuzz_accepts(const uint8_t* data, size_t size) {
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
