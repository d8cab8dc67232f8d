// PCRE2 regex (UTF + UCP, JIT-compiled) with the find_iter semantics of Rust/Oniguruma, for the
// Split and ByteLevel pre-tokenizers of tokenizer.json. Patterns are written for Oniguruma (the
// engine of Hugging Face tokenizers); oniguruma_to_pcre2 rewrites the classes whose meaning
// differs. A compiled Regex is immutable; each thread matches with its own match data.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <algorithm>
#include <new>
#include <string>
#include <string_view>

#include "engine/check.h"
#include "loaders/unicode.h"

namespace leantune::tokenizer_detail {

// tokenizers compiles its patterns with Oniguruma, whose \s is Unicode White_Space. PCRE2's \s
// with UCP also matches U+180E (\h), so \s and \S are spelled out as White_Space classes
// (\S inside a character class is left alone: no tokenizer pattern uses it).
std::string oniguruma_to_pcre2(const std::string& p);

class Regex {
 public:
  // Compiles the pattern (Oniguruma syntax unless literal); Error(kInput) naming `where`.
  Regex(const std::string& source_pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(begin, end) for each non-empty, non-overlapping match, left to right.
  template <typename F>
  void for_each_match(std::string_view s, F&& fn) const {
    ThreadState& ts = thread_state();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t start = 0;
    while (start < s.size()) {
      int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), start, 0, ts.data, ts.context)
                    : pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, ts.data,
                                  ts.context);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // Pathologically long runs: the interpreter keeps its backtracking state on the heap.
        rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, ts.data, ts.context);
      }
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        LT_THROW(ErrorKind::kInternal, "tokenizer regex match failed at byte ", start, ": ",
                 reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ts.data);
      const size_t b = ov[0], e = ov[1];
      if (e <= b) {
        // Empty matches split nothing; step over one character.
        size_t i = std::max(start, b);
        if (i >= s.size()) return;
        unicode::next_code_point(s, i);
        start = i;
        continue;
      }
      fn(b, e);
      start = e;
    }
  }

 private:
  struct ThreadState {
    pcre2_match_data* data = nullptr;
    pcre2_match_context* context = nullptr;
    pcre2_jit_stack* stack = nullptr;
    ThreadState() {
      data = pcre2_match_data_create(1, nullptr);
      context = pcre2_match_context_create(nullptr);
      stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
      if (!data || !context || !stack) throw std::bad_alloc();
      pcre2_jit_stack_assign(context, nullptr, stack);
    }
    ~ThreadState() {
      pcre2_jit_stack_free(stack);
      pcre2_match_context_free(context);
      pcre2_match_data_free(data);
    }
  };
  static ThreadState& thread_state() {
    thread_local ThreadState ts;
    return ts;
  }

  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace leantune::tokenizer_detail
