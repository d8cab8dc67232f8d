// Pattern translation and compilation of tokenizer regexes (see tokenizer_regex.h).
#include "loaders/tokenizer_regex.h"

namespace leantune::tokenizer_detail {

std::string oniguruma_to_pcre2(const std::string& p) {
  static const std::string kSpace = "\\t-\\r\\x{85}\\p{Z}";
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += in_class ? kSpace : "[" + kSpace + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + kSpace + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t close = p.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(p, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& source_pattern, bool literal, const std::string& where) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  const std::string pattern = literal ? source_pattern : oniguruma_to_pcre2(source_pattern);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err,
                        &err_offset, nullptr);
  if (!code_) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    LT_THROW(ErrorKind::kInput, where, ": cannot compile regex '", source_pattern, "' (as '",
             pattern, "') at offset ", err_offset, ": ", reinterpret_cast<const char*>(msg));
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(code_); }

}  // namespace leantune::tokenizer_detail
