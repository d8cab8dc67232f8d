// Fuzz target for the tokenizer: arbitrary bytes are encoded with the Qwen2.5 tokenizer (loaded
// once). Valid UTF-8 must encode without error, every id must be in the vocab, the ids with
// offsets must equal the plain ids, and decode(encode(x)) must give back x after NFC (the
// Qwen2.5 normalizer; x itself when x is already NFC). Invalid UTF-8 must be rejected with an
// Error of kind kInput naming the byte offset that utf8_find_invalid reports, and its
// utf8_replace_invalid() repair must then encode like valid input. Anything else -- a crash, a
// sanitizer report, another exception, an internal Error, a wrong round trip -- aborts.
//
// The first input byte also selects add_special_tokens, so both paths are covered.
//
// Two builds from this file (tests/loaders/tokenizer.cmake):
//   - fuzz_tokenizer: libFuzzer + ASan + UBSan, only with clang and LEANTUNE_FUZZ=ON:
//       CXX=clang++ CC=clang cmake -S . -B build-fuzz -DLEANTUNE_FUZZ=ON -DLEANTUNE_CUDA=OFF
//       cmake --build build-fuzz --target fuzz_tokenizer
//       build-fuzz/fuzz_tokenizer -max_total_time=3600 -max_len=4096 tests/fuzz/corpus/tokenizer
//     (copy the corpus first if new inputs should not land in the source tree).
//   - fuzz_tokenizer_corpus: the plain corpus driver of fuzz_corpus_main.h (built with ASan +
//     UBSan) over the committed corpus: good_* inputs are valid UTF-8 and encode, bad_* are
//     rejected as invalid UTF-8 (and their repair encodes).
// The tokenizer folder is LT_FUZZ_TOKENIZER_DIR (set by the build), or the environment variable
// LEANTUNE_FUZZ_TOKENIZER when it is set.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/check.h"
#include "loaders/tokenizer.h"
#include "loaders/unicode.h"
#include "tests/fuzz/fuzz_corpus_main.h"

namespace {

[[noreturn]] void fail(const char* what, std::string_view input) {
  std::fprintf(stderr, "fuzz_tokenizer: %s on input of %zu bytes\n", what, input.size());
  std::abort();
}

const leantune::Tokenizer& qwen() {
  static const std::shared_ptr<leantune::Tokenizer> tok = [] {
    const char* env = std::getenv("LEANTUNE_FUZZ_TOKENIZER");
    const std::string dir = env && *env ? env : LT_FUZZ_TOKENIZER_DIR;
    try {
      return leantune::Tokenizer::load(dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", dir.c_str(), e.what());
      std::abort();
    }
  }();
  return *tok;
}

void check_valid(const leantune::Tokenizer& tok, std::string_view text, bool add_special) {
  const std::vector<int32_t> ids = tok.encode(text, add_special);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) fail("id out of range", text);
  }
  if (tok.encode_with_offsets(text, add_special).ids != ids) fail("offsets path differs", text);
  std::string nfc;
  const std::string_view want =
      leantune::unicode::normalize(text, leantune::unicode::NormalForm::kNFC, nfc)
          ? std::string_view(nfc)
          : text;
  // skip_special_tokens drops only what add_special_tokens added (Qwen2.5 adds nothing) and
  // special tokens that were in the text; compare without skipping.
  if (tok.decode(ids, false) != want) fail("decode(encode(x)) != NFC(x)", text);
}

}  // namespace

// True when the text is valid UTF-8 and encodes; false when it is rejected as invalid UTF-8.
bool fuzz_accepts(const uint8_t* data, size_t size) {
  if (size == 0) return true;
  const leantune::Tokenizer& tok = qwen();
  const bool add_special = (data[0] & 1) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t bad = leantune::utf8_find_invalid(text);
  try {
    if (bad == std::string_view::npos) {
      check_valid(tok, text, add_special);
      return true;
    }
    try {
      tok.encode(text, add_special);
      fail("invalid UTF-8 accepted", text);
    } catch (const leantune::Error& e) {
      if (e.kind() != leantune::ErrorKind::kInput) throw;
      if (std::string(e.what()).find("byte " + std::to_string(bad)) == std::string::npos) {
        fail("invalid UTF-8 error does not name the offset", text);
      }
    }
    const std::string repaired = leantune::utf8_replace_invalid(text);
    if (leantune::utf8_find_invalid(repaired) != std::string_view::npos) {
      fail("repair left invalid UTF-8", text);
    }
    check_valid(tok, repaired, add_special);
    return false;
  } catch (const leantune::Error& e) {
    std::fprintf(stderr, "fuzz_tokenizer: unexpected error: %s\n", e.what());
    std::abort();
  }
}
