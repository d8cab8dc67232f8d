// UTF-8 and Unicode helpers for the tokenizer: strict validation, lossy repair with the
// maximal-subpart rule (Python errors='replace', Rust from_utf8_lossy), GPT-2's byte-to-unicode
// map, character classes with the exact definitions the reference implementations use, and
// Unicode normal forms through utf8proc.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace leantune::unicode {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if none starts there (overlong
// forms, surrogates and code points above U+10FFFF are invalid, as in Python and Rust).
size_t valid_sequence_length(std::string_view s, size_t i);
// Offset of the first invalid sequence or std::string_view::npos.
size_t find_invalid(std::string_view s);
// Each maximal invalid subpart becomes U+FFFD.
std::string replace_invalid(std::string_view s);

// Decodes the code point at s[i] (which must be valid UTF-8) and advances i.
inline char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    char32_t c = ((b0 & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
    i += 2;
    return c;
  }
  if (b0 < 0xF0) {
    char32_t c = ((b0 & 0x0F) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 6) |
                 (static_cast<unsigned char>(s[i + 2]) & 0x3F);
    i += 3;
    return c;
  }
  char32_t c = ((b0 & 0x07) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 12) |
               ((static_cast<unsigned char>(s[i + 2]) & 0x3F) << 6) |
               (static_cast<unsigned char>(s[i + 3]) & 0x3F);
  i += 4;
  return c;
}
// Start offset of the code point that ends at s[end-1] (s valid UTF-8, end > 0).
size_t previous_code_point_start(std::string_view s, size_t end);
// Appends code point c (at most U+10FFFF) as UTF-8: the inverse of next_code_point. Inline, so
// that the jinja lexer (also built alone, for fuzzing) uses it without this file's .cpp.
inline void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// GPT-2's reversible byte <-> printable-character map used by ByteLevel.
const std::array<char32_t, 256>& byte_to_char();
// The byte a character stands for, or -1 if the character is not in the map.
int char_to_byte(char32_t c);
// The byte-level form of raw bytes (each byte -> its character, UTF-8 encoded).
std::string bytes_to_byte_level(std::string_view bytes);
// Raw bytes of a byte-level string; false if a character is not in the map.
bool byte_level_to_bytes(std::string_view byte_level, std::string& out);

// Rust char::is_whitespace (Unicode White_Space), used by added-token lstrip/rstrip.
bool is_white_space(char32_t c);
// Python str.isspace(), used by jinja's trim filter.
bool is_python_space(char32_t c);
// Rust regex \w (letters, marks, decimal digits, connector punctuation, join controls).
bool is_word_char(char32_t c);
// Rust char::is_numeric (general categories Nd, Nl, No).
bool is_numeric(char32_t c);

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
// Normalizes valid UTF-8. Returns false (out untouched) when a cheap scan proves the text is
// already in that form, else true with out set to the normalized text (only the chunks that may
// change go through utf8proc).
bool normalize(std::string_view s, NormalForm form, std::string& out);
// Simple (1:1) lowercase mapping of every code point.
std::string to_lower(std::string_view s);

// Python str.strip() with str.isspace() semantics.
std::string_view python_strip(std::string_view s);

}  // namespace leantune::unicode
