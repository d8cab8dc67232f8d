// Recursive-descent parser for Jinja2 templates (see ast.h), following jinja2's grammar and
// operator precedence: conditional < or < and < not < comparisons < + - < ~ < * / // % < ** <
// unary - + < filters and tests (|f, is t) < postfix (.a, [i], (call)) < primary.
#include <cerrno>
#include <cstdlib>
#include <set>

#include "engine/check.h"
#include "loaders/jinja/ast.h"
#include "loaders/jinja/lexer.h"

namespace leantune::jinja {

namespace {

constexpr int kMaxDepth = 100;  // nesting of blocks and expressions (bounds the C++ stack)

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& source)
      : t_(std::move(toks)), source_(source) {}

  std::vector<NodePtr> run() {
    std::vector<NodePtr> out = parse_body({});
    if (cur().kind != Tok::kEnd) fail(cur(), "unexpected '" + describe(cur()) + "'");
    return out;
  }

 private:
  [[noreturn]] void fail(const Token& at, const std::string& what) const {
    LT_THROW(ErrorKind::kInput, source_, ":", at.line, ":", at.col, ": ", one_line(what));
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::kEnd:
        return "end of template";
      case Tok::kVarEnd:
        return "}}";
      case Tok::kBlockEnd:
        return "%}";
      case Tok::kVarBegin:
        return "{{";
      case Tok::kBlockBegin:
        return "{%";
      case Tok::kText:
        return "text";
      default:
        return t.value;
    }
  }
  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[pos_];
    if (pos_ + 1 < t_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op) const { return cur().kind == Tok::kOp && cur().value == op; }
  bool is_name(const char* n) const { return cur().kind == Tok::kName && cur().value == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op))
      fail(cur(), std::string("expected '") + op + "', got '" + describe(cur()) + "'");
  }
  std::string expect_name() {
    if (cur().kind != Tok::kName) fail(cur(), "expected a name, got '" + describe(cur()) + "'");
    return next().value;
  }
  void expect_block_end() {
    if (cur().kind != Tok::kBlockEnd) fail(cur(), "expected '%}', got '" + describe(cur()) + "'");
    next();
  }
  NodePtr node(NodeKind k, const Token& at) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = at.line;
    n->col = at.col;
    return n;
  }
  struct Depth {
    Depth(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxDepth) p_->fail(p_->cur(), "template nesting is too deep");
    }
    ~Depth() { --p_->depth_; }
    Parser* p_;
  };

  // Parses statements until a block tag whose name is in `stops` (left unconsumed: cur() is
  // that name); at top level (stops empty) until the end.
  std::vector<NodePtr> parse_body(const std::set<std::string>& stops) {
    Depth d(this);
    std::vector<NodePtr> out;
    while (true) {
      const Token& t = cur();
      if (t.kind == Tok::kEnd) {
        if (!stops.empty())
          fail(open_tags_.back(), "unclosed '" + open_tags_.back().value + "' block (expected {% " +
                                      *stops.begin() + " %})");
        return out;
      }
      if (t.kind == Tok::kText) {
        auto n = node(NodeKind::kText, t);
        n->literal = Value::string(t.value);
        out.push_back(std::move(n));
        next();
      } else if (t.kind == Tok::kVarBegin) {
        next();
        auto n = node(NodeKind::kOutput, t);
        n->args.push_back(parse_tuple_or_expr());
        if (cur().kind != Tok::kVarEnd) fail(cur(), "expected '}}', got '" + describe(cur()) + "'");
        next();
        out.push_back(std::move(n));
      } else if (t.kind == Tok::kBlockBegin) {
        const Token& name = peek();
        if (name.kind == Tok::kName && stops.count(name.value)) {
          next();
          return out;
        }
        next();
        out.push_back(parse_statement());
      } else {
        fail(t, "unexpected '" + describe(t) + "'");
      }
    }
  }

  // After the stop name: consumes "name %}" and returns the name.
  std::string end_tag() {
    std::string n = next().value;
    expect_block_end();
    return n;
  }

  NodePtr parse_statement() {
    const Token& t = cur();
    if (t.kind != Tok::kName) fail(t, "expected a statement name, got '" + describe(t) + "'");
    const std::string kw = t.value;
    open_tags_.push_back(t);
    next();
    NodePtr n;
    if (kw == "if")
      n = parse_if(t);
    else if (kw == "for")
      n = parse_for(t);
    else if (kw == "set")
      n = parse_set(t);
    else if (kw == "macro")
      n = parse_macro(t);
    else if (kw == "call")
      n = parse_call_block(t);
    else if (kw == "filter")
      n = parse_filter_block(t);
    else if (kw == "generation") {
      n = node(NodeKind::kGeneration, t);
      expect_block_end();
      n->body = parse_body({"endgeneration"});
      end_tag();
    } else if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) fail(t, "'" + kw + "' outside a loop");
      n = node(kw == "break" ? NodeKind::kBreak : NodeKind::kContinue, t);
      expect_block_end();
    } else {
      fail(t, "unknown tag '" + kw + "'");
    }
    open_tags_.pop_back();
    return n;
  }

  NodePtr parse_if(const Token& t) {
    auto n = node(NodeKind::kIf, t);
    n->args.push_back(parse_tuple_or_expr());
    expect_block_end();
    n->body = parse_body({"elif", "else", "endif"});
    const Token& which = cur();
    if (which.value == "elif") {
      next();
      n->else_body.push_back(parse_if(which));
      return n;
    }
    if (which.value == "else") {
      end_tag();
      n->else_body = parse_body({"endif"});
    }
    end_tag();
    return n;
  }

  NodePtr parse_for(const Token& t) {
    auto n = node(NodeKind::kFor, t);
    do {
      n->targets.push_back(expect_name());
    } while (accept_op(","));
    if (!is_name("in")) fail(cur(), "expected 'in' in for loop, got '" + describe(cur()) + "'");
    next();
    n->args.push_back(parse_tuple_or_expr(/*no_cond=*/true));
    NodePtr cond;
    if (is_name("if")) {
      next();
      cond = parse_expr();
    }
    n->args.push_back(std::move(cond));
    if (is_name("recursive")) fail(cur(), "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    n->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (cur().value == "else") {
      end_tag();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      n->else_body = parse_body({"endfor"});
      loop_depth_ = saved;
    }
    end_tag();
    return n;
  }

  NodePtr parse_set(const Token& t) {
    auto n = node(NodeKind::kSet, t);
    n->targets.push_back(expect_name());
    if (accept_op(".")) {
      n->name = expect_name();
    } else {
      while (accept_op(",")) n->targets.push_back(expect_name());
    }
    if (accept_op("=")) {
      n->args.push_back(parse_tuple_or_expr());
      expect_block_end();
      return n;
    }
    if (n->targets.size() != 1) fail(cur(), "a block set takes one name");
    expect_block_end();
    n->body = parse_body({"endset"});
    end_tag();
    return n;
  }

  void parse_params(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      n.targets.push_back(expect_name());
      n.defaults.push_back(accept_op("=") ? parse_expr() : nullptr);
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  NodePtr parse_macro(const Token& t) {
    auto n = node(NodeKind::kMacro, t);
    n->name = expect_name();
    parse_params(*n);
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    n->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    end_tag();
    return n;
  }

  NodePtr parse_call_block(const Token& t) {
    auto n = node(NodeKind::kCallBlock, t);
    if (is_op("(")) parse_params(*n);
    NodePtr call = parse_expr();
    if (call->kind != NodeKind::kCall) fail(t, "{% call %} expects a macro call");
    n->args.push_back(std::move(call));
    expect_block_end();
    n->body = parse_body({"endcall"});
    end_tag();
    return n;
  }

  NodePtr parse_filter_block(const Token& t) {
    auto n = node(NodeKind::kFilterBlock, t);
    do {
      n->args.push_back(parse_filter_call(nullptr));
    } while (accept_op("|"));
    expect_block_end();
    n->body = parse_body({"endfilter"});
    end_tag();
    return n;
  }

  // ---- expressions ----

  NodePtr parse_tuple_or_expr(bool no_cond = false) {
    const Token& at = cur();
    NodePtr first = no_cond ? parse_or() : parse_expr();
    if (!is_op(",")) return first;
    auto tup = node(NodeKind::kTuple, at);
    tup->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (cur().kind == Tok::kBlockEnd || cur().kind == Tok::kVarEnd || is_op(")")) break;
      tup->args.push_back(no_cond ? parse_or() : parse_expr());
    }
    return tup;
  }

  NodePtr parse_expr() {
    Depth d(this);
    const Token& at = cur();
    NodePtr e = parse_or();
    while (is_name("if")) {
      next();
      auto c = node(NodeKind::kCond, at);
      c->args.push_back(parse_or());  // condition
      c->args.push_back(std::move(e));
      if (is_name("else")) {
        next();
        c->args.push_back(parse_expr());
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  NodePtr binary(const Token& at, const std::string& op, NodePtr l, NodePtr r) {
    auto n = node(NodeKind::kBinary, at);
    n->name = op;
    n->args.push_back(std::move(l));
    n->args.push_back(std::move(r));
    return n;
  }

  // One left-associative level: operands parsed by `operand`, joined by the operator token
  // while at_operator() holds.
  template <typename AtOperator>
  NodePtr left_assoc(NodePtr (Parser::*operand)(), AtOperator at_operator) {
    NodePtr l = (this->*operand)();
    while (at_operator()) {
      const Token& at = next();
      l = binary(at, at.value, std::move(l), (this->*operand)());
    }
    return l;
  }

  NodePtr parse_or() {
    return left_assoc(&Parser::parse_and, [this] { return is_name("or"); });
  }
  NodePtr parse_and() {
    return left_assoc(&Parser::parse_not, [this] { return is_name("and"); });
  }
  NodePtr parse_not() {
    if (is_name("not")) {
      Depth d(this);
      const Token& at = next();
      auto n = node(NodeKind::kUnary, at);
      n->name = "not";
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  NodePtr parse_compare() {
    NodePtr l = parse_math1();
    // Chained comparisons (a < b < c) are rare in templates; each is folded left to right
    // as `and` of pairwise comparisons would be, sharing no evaluation.
    while (true) {
      const Token& at = cur();
      std::string op;
      if (at.kind == Tok::kOp && (at.value == "==" || at.value == "!=" || at.value == "<" ||
                                  at.value == "<=" || at.value == ">" || at.value == ">=")) {
        op = at.value;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().kind == Tok::kName && peek().value == "in") {
        op = "not in";
        next();
        next();
      } else {
        return l;
      }
      l = binary(at, op, std::move(l), parse_math1());
    }
  }
  NodePtr parse_math1() {
    return left_assoc(&Parser::parse_concat, [this] { return is_op("+") || is_op("-"); });
  }
  NodePtr parse_concat() {
    return left_assoc(&Parser::parse_math2, [this] { return is_op("~"); });
  }
  NodePtr parse_math2() {
    return left_assoc(&Parser::parse_pow,
                      [this] { return is_op("*") || is_op("/") || is_op("//") || is_op("%"); });
  }
  NodePtr parse_pow() {
    NodePtr l = parse_unary(true);
    while (is_op("**")) {
      const Token& at = next();
      l = binary(at, "**", std::move(l), parse_unary(true));
    }
    return l;
  }
  NodePtr parse_unary(bool with_filter) {
    Depth d(this);
    NodePtr n;
    if (is_op("-") || is_op("+")) {
      const Token& at = next();
      n = node(NodeKind::kUnary, at);
      n->name = at.value;
      n->args.push_back(parse_unary(false));
    } else {
      n = parse_postfix(parse_primary());
    }
    if (with_filter) return parse_filters(std::move(n));
    return n;
  }

  NodePtr parse_primary() {
    const Token& t = cur();
    switch (t.kind) {
      case Tok::kName: {
        next();
        auto n = node(NodeKind::kLiteral, t);
        if (t.value == "true" || t.value == "True")
          n->literal = Value::boolean(true);
        else if (t.value == "false" || t.value == "False")
          n->literal = Value::boolean(false);
        else if (t.value == "none" || t.value == "None")
          n->literal = Value::none();
        else {
          n->kind = NodeKind::kName;
          n->name = t.value;
        }
        return n;
      }
      case Tok::kString: {
        std::string s;
        while (cur().kind == Tok::kString) s += next().value;
        auto n = node(NodeKind::kLiteral, t);
        n->literal = Value::string(std::move(s));
        return n;
      }
      case Tok::kInt: {
        next();
        auto n = node(NodeKind::kLiteral, t);
        errno = 0;
        const long long v = std::strtoll(t.value.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(t, "integer literal out of range");
        n->literal = Value::integer(v);
        return n;
      }
      case Tok::kFloat: {
        next();
        auto n = node(NodeKind::kLiteral, t);
        n->literal = Value::real(std::strtod(t.value.c_str(), nullptr));
        return n;
      }
      case Tok::kOp:
        if (t.value == "(") {
          next();
          if (accept_op(")")) return node(NodeKind::kTuple, t);
          NodePtr e = parse_tuple_or_expr();
          expect_op(")");
          return e;
        }
        if (t.value == "[") {
          next();
          auto n = node(NodeKind::kList, t);
          while (!is_op("]")) {
            n->args.push_back(parse_expr());
            if (!accept_op(",")) break;
          }
          expect_op("]");
          return n;
        }
        if (t.value == "{") {
          next();
          auto n = node(NodeKind::kDict, t);
          while (!is_op("}")) {
            n->args.push_back(parse_expr());
            expect_op(":");
            n->args.push_back(parse_expr());
            if (!accept_op(",")) break;
          }
          expect_op("}");
          return n;
        }
        break;
      default:
        break;
    }
    fail(t, "expected an expression, got '" + describe(t) + "'");
  }

  void parse_call_args(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().kind == Tok::kName && peek().kind == Tok::kOp && peek().value == "=") {
        n.kw_names.push_back(next().value);
        next();
        n.kwargs.push_back(parse_expr());
      } else {
        if (!n.kwargs.empty()) fail(cur(), "positional argument after a keyword argument");
        n.args.push_back(parse_expr());
      }
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  NodePtr parse_postfix(NodePtr n) {
    while (true) {
      const Token& at = cur();
      if (accept_op(".")) {
        auto g = node(NodeKind::kGetAttr, at);
        if (cur().kind == Tok::kInt) {
          g->kind = NodeKind::kGetItem;
          g->args.push_back(std::move(n));
          auto idx = node(NodeKind::kLiteral, cur());
          idx->literal = Value::integer(std::strtoll(next().value.c_str(), nullptr, 10));
          g->args.push_back(std::move(idx));
        } else {
          g->name = expect_name();
          g->args.push_back(std::move(n));
        }
        n = std::move(g);
      } else if (accept_op("[")) {
        NodePtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expr();
          if (k < 2 && accept_op(":")) {
            slice = true;
            continue;
          }
          break;
        }
        expect_op("]");
        auto g = node(slice ? NodeKind::kSlice : NodeKind::kGetItem, at);
        g->args.push_back(std::move(n));
        if (!slice && !parts[0]) fail(at, "empty subscript");
        g->args.push_back(std::move(parts[0]));
        if (slice) {
          g->args.push_back(std::move(parts[1]));
          g->args.push_back(std::move(parts[2]));
        }
        n = std::move(g);
      } else if (is_op("(")) {
        auto c = node(NodeKind::kCall, at);
        c->line = n->line;  // errors of a call point at the callee
        c->col = n->col;
        c->args.push_back(std::move(n));
        parse_call_args(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  NodePtr parse_filter_call(NodePtr input) {
    const Token& at = cur();
    auto f = node(NodeKind::kFilter, at);
    f->name = expect_name();
    while (accept_op(".")) f->name += "." + expect_name();
    f->args.push_back(std::move(input));
    if (is_op("(")) parse_call_args(*f);
    return f;
  }

  NodePtr parse_filters(NodePtr n) {
    while (true) {
      if (accept_op("|")) {
        n = parse_filter_call(std::move(n));
      } else if (is_name("is")) {
        const Token& at = next();
        auto t = node(NodeKind::kTest, at);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        t->name = expect_name();
        t->args.push_back(std::move(n));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().kind == Tok::kName && !is_name("else") && !is_name("or") &&
                    !is_name("and") && !is_name("if") && !is_name("in") && !is_name("not") &&
                    !is_name("is")) ||
                   cur().kind == Tok::kString || cur().kind == Tok::kInt ||
                   cur().kind == Tok::kFloat || is_op("[") || is_op("{")) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        n = std::move(t);
      } else {
        return n;
      }
    }
  }

  std::vector<Token> t_;
  const std::string& source_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<Token> open_tags_;
};

}  // namespace

std::vector<NodePtr> parse(const std::string& text, const std::string& source) {
  return Parser(tokenize(text, source), source).run();
}

}  // namespace leantune::jinja
