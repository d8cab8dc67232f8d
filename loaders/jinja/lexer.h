// Jinja2 lexer: template source -> tokens, with the whitespace rules transformers renders chat
// templates under (trim_blocks=True, lstrip_blocks=True, '-' and '+' modifiers), comments
// dropped and {% raw %} bodies kept as text. Every token carries its 1-based line and column
// so errors can name them.
#pragma once

#include <string>
#include <vector>

namespace leantune::jinja {

enum class Tok {
  kText,        // literal template text (value)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value: the unescaped literal
  kInt,
  kFloat,
  kOp,  // value: the operator or punctuation
  kEnd,
};

struct Token {
  Tok kind;
  std::string value;
  int line = 1;
  int col = 1;
};

// Throws Error(kInput) "<source>:<line>:<col>: <what>" on a lexical error.
std::vector<Token> tokenize(const std::string& text, const std::string& source);

}  // namespace leantune::jinja
