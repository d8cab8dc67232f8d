// The plain corpus driver of every fuzz target (fuzz_jinja, fuzz_jsonl, fuzz_options,
// fuzz_checkpoint_state, fuzz_safetensors, fuzz_tokenizer; the libFuzzer builds define
// LEANTUNE_LIBFUZZER and get libFuzzer's main instead). It feeds every
// file of a corpus folder to LLVMFuzzerTestOneInput, which aborts on anything but a clean
// verdict, and checks the verdict a file's name promises: good_* accepted, bad_* rejected
// (fuzz_accepts(), defined by the target). Other names (inputs a fuzzer found) only have to be
// handled.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

bool fuzz_accepts(const uint8_t* data, size_t size);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_accepts(data, size);
  return 0;
}

#ifndef LEANTUNE_LIBFUZZER
int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(argv[1]))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  int failures = 0, good = 0, bad = 0;
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string name = p.filename().string();
    const bool ok = fuzz_accepts(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (name.rfind("good_", 0) == 0) {
      ++good;
      if (!ok) std::fprintf(stderr, "FAIL %s: rejected, expected accepted\n", name.c_str());
      failures += !ok;
    } else if (name.rfind("bad_", 0) == 0) {
      ++bad;
      if (ok) std::fprintf(stderr, "FAIL %s: accepted, expected rejected\n", name.c_str());
      failures += ok;
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
