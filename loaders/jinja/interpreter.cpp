// Tree-walking evaluation of a parsed template (see interpreter.h). Scoping follows jinja2:
// each loop iteration and each macro call gets a fresh frame over the enclosing one, so a `set`
// inside a loop does not leak out (namespace() objects are how templates carry state out).
// A rendering runs under a work and size budget (budget.h): every step charges it.
#include "loaders/jinja/interpreter.h"

#include <functional>
#include <new>

#include "engine/check.h"
#include "loaders/jinja/ast.h"
#include "loaders/jinja/builtins.h"

namespace leantune::jinja {

namespace {

constexpr int kMaxCallDepth = 32;

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;

  const Value* find(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent.get()) {
      for (const auto& [k, v] : f->vars) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const std::string& source, const std::optional<std::tm>& now, Rendered* out)
      : source_(source), now_(now), out_(out) {}
  // A macro and the frame it closes over reference each other; emptying the closure frames
  // breaks those cycles once rendering is over.
  ~Renderer() {
    for (const auto& f : closures_) f->vars.clear();
  }

  void run(const std::vector<NodePtr>& nodes, const Value& context) {
    auto globals = std::make_shared<Frame>();
    add_globals(*globals);
    frame_ = std::make_shared<Frame>();
    frame_->parent = globals;
    if (context.type == Type::kDict) {
      for (const auto& [k, v] : *context.dict) frame_->set(k, v);
    }
    // Counted from the first statement on: the context is the caller's.
    RenderBudget budget;
    exec_body(nodes, out_->text);
    out_->work_units = budget.work();
    out_->built_bytes = budget.built_bytes();
  }

 private:
  [[noreturn]] void fail(const Node& n, const std::string& what, bool limit = false) const {
    const std::string msg = detail::str_cat(source_, ":", n.line, ":", n.col, ": ", one_line(what));
    if (limit) throw TemplateLimitError(ErrorKind::kInput, msg);
    LT_THROW(ErrorKind::kInput, msg);
  }
  [[noreturn]] void fail(const Node& n, const EvalError& e) const { fail(n, e.what, e.limit); }
  // One evaluation step (real chat templates take ~100 per message) against the budget.
  void step(const Node& n) { charge(n, kStepUnits); }
  void charge(const Node& n, uint64_t units) {
    try {
      charge_work(units);
    } catch (const EvalError& e) {
      fail(n, e);
    }
  }
  void emit(const Node& n, std::string& out, const std::string& s) {
    try {
      charge_bytes(s.size());
    } catch (const EvalError& e) {
      fail(n, e);
    }
    out += s;
    if (out.size() > kMaxStringBytes) fail(n, "rendered output: " + string_limit_message(), true);
  }

  void add_globals(Frame& g) {
    g.set("range", Value::function([](const Args& a) {
            int64_t start = 0, stop = 0, stride = 1;
            auto num = [](const Value* v) {
              if (!v || (v->type != Type::kInt && v->type != Type::kBool))
                eval_fail("range() takes integers");
              return v->as_int();
            };
            if (a.positional.size() == 1) {
              stop = num(a.get(0, nullptr));
            } else if (a.positional.size() >= 2) {
              start = num(a.get(0, nullptr));
              stop = num(a.get(1, nullptr));
              if (a.positional.size() >= 3) stride = num(a.get(2, nullptr));
            } else {
              eval_fail("range expected at least 1 argument");
            }
            if (stride == 0) eval_fail("range() arg 3 must not be zero");
            List out;
            for (int64_t k = start; stride > 0 ? k < stop : k > stop;) {
              if (out.size() >= kMaxListItems) limit_fail("range(): " + list_limit_message());
              out.push_back(Value::integer(k));
              if (__builtin_add_overflow(k, stride, &k)) break;
            }
            return Value::new_list(std::move(out));
          }));
    auto make_dict = [](const Args& a, Type t) {
      Value d = Value::new_dict({}, t);
      for (const Value& p : a.positional) {
        if (p.type != Type::kDict)
          eval_fail("namespace()/dict() takes a mapping or keyword arguments");
        for (const auto& [k, v] : *p.dict) d.set(k, v);
      }
      for (const auto& [k, v] : a.keyword) {
        if (t == Type::kNamespace && !k.empty() && k[0] == '_') {
          eval_fail("namespace attributes cannot start with '_'");
        }
        d.set(k, v);
      }
      return d;
    };
    g.set("namespace",
          Value::function([make_dict](const Args& a) { return make_dict(a, Type::kNamespace); }));
    g.set("dict",
          Value::function([make_dict](const Args& a) { return make_dict(a, Type::kDict); }));
    g.set("raise_exception", Value::function([](const Args& a) -> Value {
            const Value* m = a.get(0, "message");
            eval_fail("raise_exception: " + (m ? m->str() : std::string()));
          }));
    const std::optional<std::tm> now = now_;
    g.set("strftime_now", Value::function([now](const Args& a) {
            const Value* fmt = a.get(0, "format");
            if (!fmt || fmt->type != Type::kString) eval_fail("strftime_now takes a format string");
            std::tm tm{};
            if (now) {
              tm = *now;
            } else {
              const std::time_t t = std::time(nullptr);
              localtime_r(&t, &tm);
            }
            char buf[512];
            const size_t n =
                fmt->s.size() < 200 ? std::strftime(buf, sizeof(buf), fmt->s.c_str(), &tm) : 0;
            if (n == 0 && !fmt->s.empty())
              eval_fail("strftime_now: format too long or empty result");
            return Value::string(std::string(buf, n));
          }));
  }

  // ---- statements ----

  Flow exec_body(const std::vector<NodePtr>& body, std::string& out) {
    for (const NodePtr& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  std::string capture(const std::vector<NodePtr>& body) {
    std::string s;
    exec_body(body, s);
    return s;
  }

  // A statement; a budget or value error raised outside any expression gets its position.
  Flow exec(const Node& n, std::string& out) {
    try {
      return exec_statement(n, out);
    } catch (const EvalError& e) {
      fail(n, e);
    }
  }

  Flow exec_statement(const Node& n, std::string& out) {
    step(n);
    switch (n.kind) {
      case NodeKind::kText:
        emit(n, out, n.literal.s);
        return Flow::kNormal;
      case NodeKind::kOutput: {
        const Value v = eval(*n.args[0]);
        emit(n, out, v.str());
        return Flow::kNormal;
      }
      case NodeKind::kIf:
        return exec_body(eval(*n.args[0]).truthy() ? n.body : n.else_body, out);
      case NodeKind::kFor:
        return exec_for(n, out);
      case NodeKind::kSet:
        exec_set(n);
        return Flow::kNormal;
      case NodeKind::kMacro:
        frame_->set(n.name, make_macro(n, frame_));
        return Flow::kNormal;
      case NodeKind::kCallBlock: {
        Value caller = make_macro(n, frame_);
        const Value v = eval_call(*n.args[0], &caller);
        emit(n, out, v.str());
        return Flow::kNormal;
      }
      case NodeKind::kFilterBlock: {
        Value v = Value::string(capture(n.body));
        for (const NodePtr& f : n.args) v = eval_filter(*f, v);
        emit(n, out, v.str());
        return Flow::kNormal;
      }
      case NodeKind::kGeneration: {
        const std::string body = capture(n.body);
        const size_t start = out_->text.size();  // as transformers: the output so far
        out_->generation_spans.emplace_back(start, start + body.size());
        emit(n, out, body);
        return Flow::kNormal;
      }
      case NodeKind::kBreak:
        return Flow::kBreak;
      case NodeKind::kContinue:
        return Flow::kContinue;
      default:
        fail(n, "not a statement");
    }
  }

  Flow exec_for(const Node& n, std::string& out) {
    const Value seq = eval(*n.args[0]);
    List items;
    try {
      items = iterate(seq);
    } catch (const EvalError& e) {
      fail(*n.args[0], e);
    }
    auto saved = frame_;
    auto bind = [&](const Value& item) { bind_targets(n, item, /*for_loop=*/true); };
    if (n.args[1]) {
      List kept;
      for (const Value& item : items) {
        step(n);
        frame_ = std::make_shared<Frame>();
        frame_->parent = saved;
        bind(item);
        const bool keep = eval(*n.args[1]).truthy();
        frame_ = saved;
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      step(n);
      charge(n, kLoopUnits);
      frame_ = std::make_shared<Frame>();
      frame_->parent = saved;
      Dict lv;
      lv.reserve(12);
      lv.emplace_back("index", Value::integer(k + 1));
      lv.emplace_back("index0", Value::integer(k));
      lv.emplace_back("revindex", Value::integer(len - k));
      lv.emplace_back("revindex0", Value::integer(len - k - 1));
      lv.emplace_back("first", Value::boolean(k == 0));
      lv.emplace_back("last", Value::boolean(k == len - 1));
      lv.emplace_back("length", Value::integer(len));
      lv.emplace_back("depth", Value::integer(1));
      lv.emplace_back("depth0", Value::integer(0));
      lv.emplace_back("previtem",
                      k > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
      lv.emplace_back("nextitem",
                      k + 1 < len ? items[k + 1] : Value::undefined("there is no next item"));
      lv.emplace_back("cycle", Value::function([k](const Args& a) {
                        if (a.positional.empty()) eval_fail("no items for cycling given");
                        return a.positional[static_cast<size_t>(k) % a.positional.size()];
                      }));
      // Made afresh for every iteration and dropped after it: its cost is in kLoopUnits, not in
      // the size budget.
      Value loop;
      loop.type = Type::kDict;
      loop.dict = std::make_shared<Dict>(std::move(lv));
      frame_->set("loop", std::move(loop));
      bind(items[k]);
      const Flow f = exec_body(n.body, out);
      frame_ = saved;
      if (f == Flow::kBreak) break;
    }
    if (len == 0) return exec_body(n.else_body, out);
    return Flow::kNormal;
  }

  void exec_set(const Node& n) {
    Value v = n.args.empty() ? Value::string(capture(n.body)) : eval(*n.args[0]);
    if (!n.name.empty()) {
      const Value* ns = frame_->find(n.targets[0]);
      if (!ns || ns->type != Type::kNamespace) {
        fail(n, "cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
      }
      Value target = *ns;
      target.set(n.name, std::move(v));
      return;
    }
    bind_targets(n, std::move(v), /*for_loop=*/false);
  }

  // Binds n.targets (of a for or a set) to v: one name takes v, several take its items in
  // order. A count mismatch names both counts in a for loop, the names' count in a set.
  void bind_targets(const Node& n, Value v, bool for_loop) {
    if (n.targets.size() == 1) {
      frame_->set(n.targets[0], std::move(v));
      return;
    }
    List parts;
    try {
      parts = iterate(v);
    } catch (const EvalError& e) {
      fail(n, "cannot unpack: " + e.what, e.limit);
    }
    if (parts.size() != n.targets.size()) {
      const std::string names = std::to_string(n.targets.size()) + " names";
      fail(n, for_loop ? "cannot unpack " + std::to_string(parts.size()) + " values into " + names
                       : "cannot unpack into " + names);
    }
    for (size_t k = 0; k < parts.size(); ++k) frame_->set(n.targets[k], parts[k]);
  }

  // A macro (or a call block's caller) as a callable bound to its defining frame.
  Value make_macro(const Node& n, std::shared_ptr<Frame> closure) {
    const Node* node = &n;
    closures_.push_back(closure);
    return Value::function([this, node, closure](const Args& a) {
      if (a.positional.size() > node->targets.size()) {
        eval_fail("macro '" + node->name + "' takes at most " +
                  std::to_string(node->targets.size()) + " arguments");
      }
      if (++call_depth_ > kMaxCallDepth) {
        --call_depth_;
        eval_fail("macro recursion is too deep");
      }
      auto saved = frame_;
      frame_ = std::make_shared<Frame>();
      frame_->parent = closure;
      std::string out;
      try {
        for (size_t k = 0; k < node->targets.size(); ++k) {
          const Value* v = a.get(k, node->targets[k].c_str());
          if (v)
            frame_->set(node->targets[k], *v);
          else if (node->defaults[k])
            frame_->set(node->targets[k], eval(*node->defaults[k]));
          else
            frame_->set(node->targets[k],
                        Value::undefined("'" + node->targets[k] + "' is undefined"));
        }
        for (const auto& [k, v] : a.keyword) {
          if (k == "caller")
            frame_->set("caller", v);
          else if (std::find(node->targets.begin(), node->targets.end(), k) ==
                   node->targets.end()) {
            eval_fail("macro '" + node->name + "' takes no keyword argument '" + k + "'");
          }
        }
        exec_body(node->body, out);
      } catch (...) {
        frame_ = saved;
        --call_depth_;
        throw;
      }
      frame_ = saved;
      --call_depth_;
      return Value::string(std::move(out));
    });
  }

  // ---- expressions ----

  Args eval_args(const Node& n, size_t first) {
    Args a;
    for (size_t k = first; k < n.args.size(); ++k) a.positional.push_back(eval(*n.args[k]));
    for (size_t k = 0; k < n.kwargs.size(); ++k)
      a.keyword.emplace_back(n.kw_names[k], eval(*n.kwargs[k]));
    return a;
  }

  Value eval_call(const Node& n, const Value* caller) {
    const Value fn = eval(*n.args[0]);
    Args a = eval_args(n, 1);
    if (caller) a.keyword.emplace_back("caller", *caller);
    if (fn.type != Type::kFunction) {
      fail(n, fn.is_undefined() ? undefined_message(fn)
                                : "'" + fn.type_name() + "' object is not callable");
    }
    try {
      return (*fn.fn)(a);
    } catch (const EvalError& e) {
      fail(n, e);
    }
  }

  Value eval_filter(const Node& n, const Value& input) {
    const Args a = eval_args(n, 1);
    try {
      return apply_filter(n.name, input, a);
    } catch (const EvalError& e) {
      fail(n, e);
    }
  }

  Value eval(const Node& n) {
    step(n);
    try {
      return eval_inner(n);
    } catch (const EvalError& e) {
      fail(n, e);
    }
  }

  Value eval_inner(const Node& n) {
    switch (n.kind) {
      case NodeKind::kLiteral:
        return n.literal;
      case NodeKind::kName: {
        const Value* v = frame_->find(n.name);
        return v ? *v : Value::undefined("'" + n.name + "' is undefined");
      }
      case NodeKind::kList:
      case NodeKind::kTuple: {
        List items;
        for (const NodePtr& e : n.args) items.push_back(eval(*e));
        if (n.kind == NodeKind::kTuple) return Value::new_tuple(std::move(items));
        return Value::new_list(std::move(items));
      }
      case NodeKind::kDict: {
        Value d = Value::new_dict();
        for (size_t k = 0; k + 1 < n.args.size(); k += 2) {
          const Value key = eval(*n.args[k]);
          if (key.type != Type::kString) fail(*n.args[k], "dict keys must be strings");
          d.set(key.s, eval(*n.args[k + 1]));
        }
        return d;
      }
      case NodeKind::kGetAttr: {
        const Value obj = eval(*n.args[0]);
        if (obj.is_undefined()) fail(n, undefined_message(obj));
        if (obj.type == Type::kDict) {
          const Value m =
              n.name == "get" || n.name == "items" || n.name == "keys" || n.name == "values"
                  ? get_method(obj, n.name)
                  : Value::undefined();
          if (!m.is_undefined()) return m;
          const Value* v = obj.find(n.name);
          return v ? *v : Value::undefined("'dict object' has no attribute '" + n.name + "'");
        }
        if (obj.type == Type::kNamespace) {
          const Value* v = obj.find(n.name);
          return v ? *v : Value::undefined("'Namespace' has no attribute '" + n.name + "'");
        }
        if (obj.type == Type::kString) return get_method(obj, n.name);
        return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + n.name +
                                "'");
      }
      case NodeKind::kGetItem:
        return subscript(eval(*n.args[0]), eval(*n.args[1]));
      case NodeKind::kSlice: {
        const Value obj = eval(*n.args[0]);
        Value parts[3];
        const Value* p[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k) {
          if (n.args[k + 1]) {
            parts[k] = eval(*n.args[k + 1]);
            p[k] = &parts[k];
          }
        }
        return slice(obj, p[0], p[1], p[2]);
      }
      case NodeKind::kCall:
        return eval_call(n, nullptr);
      case NodeKind::kFilter:
        return eval_filter(n, eval(*n.args[0]));
      case NodeKind::kTest: {
        const Value v = eval(*n.args[0]);
        const Args a = eval_args(n, 1);
        return Value::boolean(apply_test(n.name, v, a) != n.negated);
      }
      case NodeKind::kUnary: {
        const Value v = eval(*n.args[0]);
        if (n.name == "not") return Value::boolean(!v.truthy());
        if (!v.is_number())
          fail(n, "bad operand type for unary " + n.name + ": '" + v.type_name() + "'");
        if (n.name == "+") return v.type == Type::kFloat ? v : Value::integer(v.as_int());
        if (v.type == Type::kFloat) return Value::real(-v.f);
        if (v.as_int() == INT64_MIN) fail(n, "integer overflow");
        return Value::integer(-v.as_int());
      }
      case NodeKind::kBinary:
        return eval_binary(n);
      case NodeKind::kCond:
        if (eval(*n.args[0]).truthy()) return eval(*n.args[1]);
        return n.args[2] ? eval(*n.args[2])
                         : Value::undefined("the conditional expression has no else");
      default:
        fail(n, "not an expression");
    }
  }

  Value eval_binary(const Node& n) {
    const std::string& op = n.name;
    const Value a = eval(*n.args[0]);
    if (op == "and") return a.truthy() ? eval(*n.args[1]) : a;
    if (op == "or") return a.truthy() ? a : eval(*n.args[1]);
    const Value b = eval(*n.args[1]);
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      bool ok = true;
      const bool lt = op[0] == '<' ? less(a, b, &ok) : less(b, a, &ok);
      if (!ok) {
        fail(n, "'" + op + "' not supported between instances of '" + a.type_name() + "' and '" +
                    b.type_name() + "'");
      }
      return Value::boolean(lt || (op.size() == 2 && equal(a, b)));
    }
    if (op == "in") return Value::boolean(contains(b, a));
    if (op == "not in") return Value::boolean(!contains(b, a));
    if (op == "~") {
      std::string s = a.str() + b.str();
      if (s.size() > kMaxStringBytes) fail(n, string_limit_message(), true);
      return Value::string(std::move(s));
    }
    return binary_op(op, a, b);
  }

  const std::string& source_;
  std::optional<std::tm> now_;
  Rendered* out_;
  std::shared_ptr<Frame> frame_;
  int call_depth_ = 0;
  std::vector<std::shared_ptr<Frame>> closures_;
};

// Unknown filters and tests are errors when the template is compiled, as in jinja2.
void check_names(const std::vector<NodePtr>& nodes, const std::string& source,
                 bool* has_generation);

void check_node(const Node& n, const std::string& source, bool* has_generation) {
  if (n.kind == NodeKind::kFilter && !has_filter(n.name)) {
    LT_THROW(ErrorKind::kInput, source, ":", n.line, ":", n.col, ": unknown filter '",
             one_line(n.name), "'");
  }
  if (n.kind == NodeKind::kTest && !has_test(n.name)) {
    LT_THROW(ErrorKind::kInput, source, ":", n.line, ":", n.col, ": unknown test '",
             one_line(n.name), "'");
  }
  if (n.kind == NodeKind::kGeneration) *has_generation = true;
  for (const auto* list : {&n.args, &n.kwargs, &n.defaults, &n.body, &n.else_body}) {
    for (const NodePtr& c : *list) {
      if (c) check_node(*c, source, has_generation);
    }
  }
}

void check_names(const std::vector<NodePtr>& nodes, const std::string& source,
                 bool* has_generation) {
  for (const NodePtr& n : nodes) check_node(*n, source, has_generation);
}

}  // namespace

Template::Template(const std::string& text, std::string source) : source_(std::move(source)) {
  auto nodes = std::make_shared<std::vector<NodePtr>>(parse(text, source_));
  check_names(*nodes, source_, &has_generation_);
  nodes_ = std::move(nodes);
}

Rendered Template::render(const Value& context, const std::optional<std::tm>& now) const {
  Rendered out;
  try {
    Renderer(source_, now, &out).run(*nodes_, context);
  } catch (const std::bad_alloc&) {
    LT_THROW(ErrorKind::kOutOfMemory, source_,
             ": out of host memory while rendering this chat template (its values count against "
             "a limit of ",
             kMaxBuiltBytes >> 20, " MiB; the rest of the process holds the remainder)");
  }
  return out;
}

}  // namespace leantune::jinja
