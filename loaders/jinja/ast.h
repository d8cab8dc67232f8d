// Syntax tree of a Jinja2 template (built by parser.cpp, walked by interpreter.cpp). One node
// type with a kind tag keeps the tree small; the comment on each kind says which fields it uses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loaders/jinja/value.h"

namespace leantune::jinja {

enum class NodeKind {
  // Expressions.
  kLiteral,  // literal
  kName,     // name
  kList,     // args: items
  kTuple,    // args: items
  kDict,     // args: key0, value0, key1, value1, ...
  kGetAttr,  // args[0]: object; name: attribute
  kGetItem,  // args[0]: object, args[1]: index
  kSlice,    // args[0]: object, args[1..3]: start/stop/step (nullptr when omitted)
  kCall,     // args[0]: callee, then positional args; kw_names/kwargs: keyword args
  kFilter,   // args[0]: input (nullptr in a filter block); name; then args; kw_names/kwargs
  kTest,     // args[0]: value; name; then args; negated
  kUnary,    // name: "not" | "-" | "+"; args[0]
  kBinary,   // name: operator ("+", "and", "in", "not in", "==", "~", ...); args[0], args[1]
  kCond,     // args[0]: condition, args[1]: then, args[2]: else (nullptr when omitted)
  // Statements.
  kText,       // literal (string)
  kOutput,     // args[0]: expression
  kIf,         // args[0]: condition; body; else_body (an elif is an kIf in else_body)
  kFor,        // targets; args[0]: iterable, args[1]: filter condition or nullptr; body; else_body
  kSet,        // targets (names) or targets[0] + name (namespace attribute); args[0] or body
  kMacro,      // name; targets: parameters; defaults (nullptr where none); body
  kCallBlock,  // args[0]: the call; targets/defaults: caller's parameters; body
  kFilterBlock,  // args: filters (kFilter with null input), applied in order; body
  kGeneration,   // body
  kBreak,
  kContinue,
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeKind kind;
  int line = 1;
  int col = 1;
  std::string name;
  Value literal;
  std::vector<NodePtr> args;
  std::vector<std::string> kw_names;
  std::vector<NodePtr> kwargs;
  std::vector<std::string> targets;
  std::vector<NodePtr> defaults;
  std::vector<NodePtr> body;
  std::vector<NodePtr> else_body;
  bool negated = false;
};

// Parses a template. Throws Error(kInput) "<source>:<line>:<col>: <what>" on a syntax error
// (unclosed block, unknown tag, bad expression, nesting deeper than a fixed limit).
std::vector<NodePtr> parse(const std::string& text, const std::string& source);

}  // namespace leantune::jinja
