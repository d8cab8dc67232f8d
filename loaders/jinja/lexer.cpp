// Jinja2 lexer (see lexer.h). Whitespace control follows jinja2's lexer: '{%-' strips all
// whitespace before the tag, '-%}' all whitespace after it; lstrip_blocks strips the spaces and
// tabs between a line start and a block/comment tag ('{%+' opts out); trim_blocks drops the
// single newline after a block/comment tag ('+%}' opts out).
#include "loaders/jinja/lexer.h"

#include <cctype>
#include <iterator>

#include "engine/check.h"
#include "loaders/jinja/value.h"
#include "loaders/unicode.h"

namespace leantune::jinja {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  Lexer(const std::string& text, const std::string& source) : src_(text), source_(source) {}

  std::vector<Token> run() {
    std::string pending;  // text since the last tag
    bool strip_next = false;
    bool trim_next_newline = false;
    bool line_starting = true;  // the previous tag's match ended with a newline (or none yet)
    while (pos_ < src_.size()) {
      const size_t open = find_open(pos_);
      std::string text = src_.substr(pos_, open - pos_);
      const int text_line = line_, text_col = col_;
      advance_to(open);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        if (k > 0) line_starting = text[k - 1] == '\n';
        text.erase(0, k);
      } else if (trim_next_newline) {
        if (text.rfind("\r\n", 0) == 0) {
          text.erase(0, 2);
          line_starting = true;
        } else if (!text.empty() && text[0] == '\n') {
          text.erase(0, 1);
          line_starting = true;
        }
      }
      strip_next = trim_next_newline = false;
      if (open >= src_.size()) {
        emit_text(text, text_line, text_col);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (mod != '+' && kind != '{') {
        lstrip(text, line_starting);
      }
      emit_text(text, text_line, text_col);
      const int tag_line = line_, tag_col = col_;
      advance_to(open + 2 + (mod == '-' || mod == '+' ? 1 : 0));
      char end_mod = '\0';
      if (kind == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string::npos) fail(tag_line, tag_col, "unclosed comment");
        end_mod = close > pos_ ? src_[close - 1] : '\0';
        advance_to(close + 2);
      } else if (kind == '%' && raw_block()) {
        continue_raw(tag_line, tag_col, &end_mod);
      } else {
        out_.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", tag_line, tag_col});
        end_mod = lex_tag(kind == '{' ? '}' : '%', tag_line, tag_col);
      }
      strip_next = end_mod == '-';
      line_starting = false;
      trim_next_newline = kind != '{' && end_mod != '+' && end_mod != '-';
    }
    out_.push_back({Tok::kEnd, "", line_, col_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(int line, int col, const std::string& what) const {
    LT_THROW(ErrorKind::kInput, source_, ":", line, ":", col, ": ", one_line(what));
  }

  size_t find_open(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k) {
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#'))
        return k;
    }
    return src_.size();
  }

  void advance_to(size_t to) {
    for (; pos_ < to && pos_ < src_.size(); ++pos_) {
      if (src_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else if ((static_cast<unsigned char>(src_[pos_]) & 0xC0) != 0x80) {
        ++col_;
      }
    }
  }

  // lstrip_blocks: drop the spaces/tabs between the line start and the tag.
  // As jinja2: the text holds a newline followed only by spaces/tabs, or is only spaces/tabs
  // right after a tag whose match ended with a newline (or at the template start).
  static void lstrip(std::string& text, bool line_starting) {
    size_t k = text.size();
    while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
    if (k > 0 ? text[k - 1] == '\n' : line_starting) text.erase(k);
  }

  void emit_text(const std::string& text, int line, int col) {
    if (!text.empty()) out_.push_back({Tok::kText, text, line, col});
  }

  // {% raw %} ... {% endraw %}: the body is text.
  bool raw_block() const {
    size_t k = pos_;
    while (k < src_.size() && is_space(src_[k])) ++k;
    if (src_.compare(k, 3, "raw") != 0) return false;
    k += 3;
    while (k < src_.size() && is_space(src_[k])) ++k;
    if (k < src_.size() && src_[k] == '-') ++k;
    return src_.compare(k, 2, "%}") == 0;
  }
  void continue_raw(int tag_line, int tag_col, char* end_mod) {
    const size_t close = src_.find("%}", pos_);
    const bool strip_after = src_[close - 1] == '-';
    advance_to(close + 2);
    for (size_t k = pos_; (k = src_.find("{%", k)) != std::string::npos; ++k) {
      size_t j = k + 2;
      const bool strip_before = j < src_.size() && src_[j] == '-';
      if (strip_before || (j < src_.size() && src_[j] == '+')) ++j;
      while (j < src_.size() && is_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      while (j < src_.size() && is_space(src_[j])) ++j;
      *end_mod = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j++] : '\0';
      if (src_.compare(j, 2, "%}") != 0) continue;
      std::string body = src_.substr(pos_, k - pos_);
      if (strip_after) {
        size_t s = 0;
        while (s < body.size() && is_space(body[s])) ++s;
        body.erase(0, s);
      }
      if (strip_before) {
        while (!body.empty() && is_space(body.back())) body.pop_back();
      }
      emit_text(body, line_, col_);
      advance_to(j + 2);
      return;
    }
    fail(tag_line, tag_col, "unclosed {% raw %} block (no {% endraw %})");
  }

  // Lexes the inside of a {{ }} or {% %} tag; returns the close modifier ('-', '+' or 0).
  char lex_tag(char close, int tag_line, int tag_col) {
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size())
        fail(tag_line, tag_col,
             close == '}' ? "unclosed '{{' (no '}}')" : "unclosed '{%' (no '%}')");
      const int l = line_, c = col_;
      const char ch = src_[pos_];
      auto closes_at = [&](size_t k) {
        return src_.compare(k, 2, std::string(1, close) + "}") == 0;
      };
      if (depth == 0 && (ch == '-' || ch == '+') && pos_ + 1 < src_.size() && closes_at(pos_ + 1)) {
        advance_to(pos_ + 3);
        out_.push_back({close == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", l, c});
        return ch;
      }
      if (depth == 0 && closes_at(pos_)) {
        advance_to(pos_ + 2);
        out_.push_back({close == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", l, c});
        return '\0';
      }
      if (std::isalpha(static_cast<unsigned char>(ch)) || ch == '_') {
        size_t k = pos_;
        while (k < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[k])) || src_[k] == '_'))
          ++k;
        out_.push_back({Tok::kName, src_.substr(pos_, k - pos_), l, c});
        advance_to(k);
      } else if (std::isdigit(static_cast<unsigned char>(ch))) {
        lex_number(l, c);
      } else if (ch == '\'' || ch == '"') {
        lex_string(l, c);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                     "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        std::string op;
        for (const char* o : kOps) {
          if (src_.compare(pos_, std::char_traits<char>::length(o), o) == 0) {
            op = o;
            break;
          }
        }
        if (op.empty()) fail(l, c, std::string("unexpected character '") + ch + "'");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        out_.push_back({Tok::kOp, op, l, c});
        advance_to(pos_ + op.size());
      }
    }
  }

  void lex_number(int l, int c) {
    size_t k = pos_;
    auto digits = [&] {
      while (k < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[k])) || src_[k] == '_'))
        ++k;
    };
    digits();
    bool is_float = false;
    if (k + 1 < src_.size() && src_[k] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
      is_float = true;
      ++k;
      digits();
    }
    if (k < src_.size() && (src_[k] == 'e' || src_[k] == 'E')) {
      size_t e = k + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        k = e;
        digits();
      }
    }
    std::string text;
    for (size_t j = pos_; j < k; ++j) {
      if (src_[j] != '_') text.push_back(src_[j]);
    }
    out_.push_back({is_float ? Tok::kFloat : Tok::kInt, text, l, c});
    advance_to(k);
  }

  // The character a one-letter escape (\n \t \r \0 \b \f \v \a) stands for; nullptr for
  // any other letter.
  static const char* simple_escape(char e) {
    static constexpr char kLetters[] = {'n', 't', 'r', '0', 'b', 'f', 'v', 'a'};
    static constexpr char kChars[] = {'\n', '\t', '\r', '\0', '\b', '\f', '\v', '\a'};
    for (size_t i = 0; i < std::size(kLetters); ++i) {
      if (kLetters[i] == e) return &kChars[i];
    }
    return nullptr;
  }

  void lex_string(int l, int c) {
    const char q = src_[pos_];
    std::string out;
    size_t k = pos_ + 1;
    for (; k < src_.size() && src_[k] != q; ++k) {
      if (src_[k] != '\\' || k + 1 >= src_.size()) {
        out.push_back(src_[k]);
        continue;
      }
      const char e = src_[++k];
      if (const char* simple = simple_escape(e)) {
        out.push_back(*simple);
        continue;
      }
      switch (e) {
        case '\\':
        case '\'':
        case '"':
          out.push_back(e);
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          if (k + n >= src_.size()) fail(l, c, "truncated \\" + std::string(1, e) + " escape");
          for (size_t d = 1; d <= n; ++d) {
            const char h = src_[k + d];
            if (!std::isxdigit(static_cast<unsigned char>(h)))
              fail(l, c, "bad \\" + std::string(1, e) + " escape");
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                     ? h - '0'
                                                     : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF) fail(l, c, "escape out of the Unicode range");
          k += n;
          unicode::append_utf8(out, cp);
          break;
        }
        default:
          out.push_back('\\');
          out.push_back(e);
      }
    }
    if (k >= src_.size()) fail(l, c, "unterminated string literal");
    out_.push_back({Tok::kString, out, l, c});
    advance_to(k + 1);
  }

  const std::string& src_;
  const std::string& source_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& text, const std::string& source) {
  // jinja2's default keep_trailing_newline=False drops one trailing newline.
  std::string body = text;
  if (body.size() >= 2 && body.compare(body.size() - 2, 2, "\r\n") == 0)
    body.resize(body.size() - 2);
  else if (!body.empty() && (body.back() == '\n' || body.back() == '\r'))
    body.pop_back();
  return Lexer(body, source).run();
}

}  // namespace leantune::jinja
