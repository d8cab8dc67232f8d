// UTF-8 validation/repair, GPT-2 byte map, character classes and normal forms (see unicode.h).
#include "loaders/unicode.h"

#include <utf8proc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "engine/check.h"

namespace leantune::unicode {

namespace {

// Allowed range of the second byte for each lead byte (Unicode Table 3-7); later continuation
// bytes are always 80..BF. Returns the sequence length, 0 for an invalid lead byte.
inline int lead_info(unsigned char b0, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (b0 < 0x80) return 1;
  if (b0 < 0xC2) return 0;
  if (b0 < 0xE0) return 2;
  if (b0 < 0xF0) {
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
    return 3;
  }
  if (b0 < 0xF5) {
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

// Number of bytes at s[i] that form the longest prefix of a valid sequence (>= 1), and
// whether that prefix is a complete sequence.
inline size_t maximal_prefix(std::string_view s, size_t i, bool& complete) {
  unsigned char lo, hi;
  const int n = lead_info(static_cast<unsigned char>(s[i]), lo, hi);
  complete = false;
  if (n == 0) return 1;
  if (n == 1) {
    complete = true;
    return 1;
  }
  size_t k = 1;
  for (; k < static_cast<size_t>(n); ++k) {
    if (i + k >= s.size()) return k;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80;
    const unsigned char h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return k;
  }
  complete = true;
  return k;
}

inline bool is_ascii_block(const char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return (w & 0x8080808080808080ULL) == 0;
}

}  // namespace

size_t valid_sequence_length(std::string_view s, size_t i) {
  bool complete;
  const size_t k = maximal_prefix(s, i, complete);
  return complete ? k : 0;
}

size_t find_invalid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    if (i + 8 <= n && is_ascii_block(s.data() + i)) {
      i += 8;
      continue;
    }
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    bool complete;
    const size_t k = maximal_prefix(s, i, complete);
    if (!complete) return i;
    i += k;
  }
  return std::string_view::npos;
}

std::string replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    bool complete;
    const size_t k = maximal_prefix(s, i, complete);
    if (complete) {
      out.append(s.data() + i, k);
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += k;
  }
  return out;
}

size_t previous_code_point_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

namespace {
struct ByteMaps {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 0x144> to_byte{};
  ByteMaps() {
    to_byte.fill(-1);
    // Printable bytes stand for themselves; the others are shifted to U+0100 + n in order.
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      to_char[b] = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMaps& byte_maps() {
  static const ByteMaps maps;
  return maps;
}
}  // namespace

const std::array<char32_t, 256>& byte_to_char() { return byte_maps().to_char; }

int char_to_byte(char32_t c) {
  const auto& m = byte_maps().to_byte;
  return c < m.size() ? m[c] : -1;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& m = byte_to_char();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, m[b]);
  return out;
}

bool byte_level_to_bytes(std::string_view byte_level, std::string& out) {
  out.clear();
  size_t i = 0;
  while (i < byte_level.size()) {
    const char32_t c = next_code_point(byte_level, i);
    const int b = char_to_byte(c);
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
  }
  return true;
}

bool is_white_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_python_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return is_white_space(c);
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

namespace {

// True when no normal form changes the code point or combines it with a neighbour: canonical
// combining class 0, no decomposition, not the second element of a composition pair, not Hangul
// (syllables and conjoining jamo are decomposed and composed algorithmically).
bool inert_under_all_forms(char32_t c) {
  if ((c >= 0x1100 && c <= 0x11FF) || (c >= 0xA960 && c <= 0xA97F) ||
      (c >= 0xAC00 && c <= 0xD7FF)) {
    return false;
  }
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
  return p->combining_class == 0 && p->decomp_seqindex == UINT16_MAX &&
         (p->comb_index == UINT16_MAX || (p->comb_index & 0x8000) == 0);
}

// NFC_Quick_Check=Yes with combining class 0: NFC leaves the code point as it is and never
// combines it with its neighbours (precomposed letters such as U+00E9 qualify; a string made only
// of such code points is in NFC). Computed from utf8proc once per BMP code point, on first use.
bool nfc_inert(char32_t c) {
  if (c >= 0x10000) return inert_under_all_forms(c);
  static std::atomic<uint8_t> known[0x10000];  // 0 unknown, 1 inert, 2 not
  const uint8_t k = known[c].load(std::memory_order_relaxed);
  if (k != 0) return k == 1;
  bool inert = false;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
  const bool hangul_jamo =
      (c >= 0x1100 && c <= 0x11FF) || (c >= 0xA960 && c <= 0xA97F) || (c >= 0xD7B0 && c <= 0xD7FF);
  if (!hangul_jamo && !(c >= 0xD800 && c <= 0xDFFF) && p->combining_class == 0 &&
      (p->comb_index == UINT16_MAX || (p->comb_index & 0x8000) == 0)) {
    std::string one;
    append_utf8(one, c);
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(one.data()),
                     static_cast<utf8proc_ssize_t>(one.size()), &result,
                     static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    inert = n == static_cast<utf8proc_ssize_t>(one.size()) &&
            std::memcmp(result, one.data(), one.size()) == 0;
    std::free(result);
  }
  known[c].store(inert ? 1 : 2, std::memory_order_relaxed);
  return inert;
}

void utf8proc_normalize(std::string_view s, NormalForm form, std::string& out) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &result,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) {
    std::free(result);
    LT_THROW(ErrorKind::kInternal, "utf8proc normalization failed: ", utf8proc_errmsg(n));
  }
  out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
  std::free(result);
}

}  // namespace

bool normalize(std::string_view s, NormalForm form, std::string& out) {
  // Most text is unchanged; prove it cheaply and hand only the parts that may change to
  // utf8proc. Every normal form maps a chunk that starts at an ASCII character independently of
  // what precedes it (ASCII characters have combining class 0, are never the second element of
  // a composition, and are unchanged), so chunks [ASCII char, next ASCII char) without a
  // suspicious code point are copied as they are.
  const bool nfc = form == NormalForm::kNFC;
  size_t copied = 0;       // s[0, copied) is already in out
  size_t chunk_start = 0;  // the last position before which nothing can interact
  bool changed = false;
  size_t i = 0;
  while (i < s.size()) {
    if (i + 8 <= s.size() && is_ascii_block(s.data() + i)) {
      i += 8;
      chunk_start = i - 1;
      continue;
    }
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      chunk_start = i++;
      continue;
    }
    const char32_t c = next_code_point(s, i);
    if (nfc ? nfc_inert(c) : inert_under_all_forms(c)) continue;
    // Normalize from the chunk start (the last ASCII character, or the start) to the next
    // ASCII character: the inert characters before it may still compose with it.
    const size_t b = chunk_start;
    size_t e = i;
    while (e < s.size() && static_cast<unsigned char>(s[e]) >= 0x80) ++e;
    if (!changed) {
      out.clear();
      changed = true;
    }
    out.append(s.data() + copied, b - copied);
    utf8proc_normalize(s.substr(b, e - b), form, out);
    copied = e;
    i = e;
    chunk_start = e;
  }
  if (!changed) return false;
  out.append(s.data() + copied, s.size() - copied);
  return true;
}

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = next_code_point(s, i);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    } else {
      append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

std::string_view python_strip(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    size_t j = b;
    if (!is_python_space(next_code_point(s, j))) break;
    b = j;
  }
  size_t e = s.size();
  while (e > b) {
    const size_t start = previous_code_point_start(s, e);
    size_t j = start;
    if (!is_python_space(next_code_point(s, j))) break;
    e = start;
  }
  return s.substr(b, e - b);
}

}  // namespace leantune::unicode
