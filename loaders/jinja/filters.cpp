// Jinja2 filters and tests as jinja2 3.1 defines them, with transformers' tojson override
// (json.dumps(x, ensure_ascii=False, indent, separators, sort_keys=False)). See builtins.h.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "loaders/jinja/builtins.h"

namespace leantune::jinja {

namespace {

const Value* arg(const Args& a, size_t i, const char* name) { return a.get(i, name); }

bool flag(const Args& a, size_t i, const char* name) {
  const Value* v = a.get(i, name);
  return v && v->truthy();
}

// item.attr or a dotted path "a.b" / "0", as jinja2's make_attrgetter.
Value attribute(const Value& item, const std::string& path) {
  Value cur = item;
  size_t at = 0;
  while (true) {
    const size_t dot = path.find('.', at);
    const std::string part =
        path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (cur.is_undefined()) return cur;
    cur = numeric && cur.type == Type::kList
              ? subscript(cur, Value::integer(std::atoll(part.c_str())))
              : subscript(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    at = dot + 1;
  }
}

Args rest_args(const Args& a, size_t from) {
  Args out;
  for (size_t k = from; k < a.positional.size(); ++k) out.positional.push_back(a.positional[k]);
  out.keyword = a.keyword;
  return out;
}

// The comparisons of a merge sort of n items (n log2 n), charged to the budget before sorting.
uint64_t sort_comparisons(size_t n) {
  uint64_t c = n;
  for (size_t k = n; k > 1; k /= 2) c += n;
  return c;
}

Value sort_keys_copy(const Value& v) {
  if (v.type == Type::kList) {
    List out;
    for (const Value& x : *v.list) out.push_back(sort_keys_copy(x));
    return Value::new_list(std::move(out));
  }
  if (v.type != Type::kDict) return v;
  Dict out;
  for (const auto& [k, x] : *v.dict) out.emplace_back(k, sort_keys_copy(x));
  charge_work(sort_comparisons(out.size()));
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return Value::new_dict(std::move(out));
}

Value tojson(const Value& v, const Args& a) {
  const Value* indent = arg(a, 0, "indent");
  const Value* separators = a.get(99, "separators");
  if (flag(a, 99, "ensure_ascii")) eval_fail("tojson(ensure_ascii=True) is not supported");
  int ind = -1;
  if (indent && indent->type != Type::kNone) {
    if (indent->type == Type::kInt)
      ind = static_cast<int>(std::clamp<int64_t>(indent->i, 0, 64));
    else
      eval_fail("tojson indent must be an integer");
  }
  std::string item_sep = ind >= 0 ? "," : ", ", key_sep = ": ";
  if (separators && separators->type == Type::kList && separators->list->size() == 2 &&
      (*separators->list)[0].type == Type::kString &&
      (*separators->list)[1].type == Type::kString) {
    item_sep = (*separators->list)[0].s;
    key_sep = (*separators->list)[1].s;
  } else if (separators && separators->type != Type::kNone) {
    eval_fail("tojson separators must be a pair of strings");
  }
  if (v.is_undefined()) eval_fail("Object of type Undefined is not JSON serializable");
  if (v.type == Type::kFunction || v.type == Type::kNamespace) {
    eval_fail("Object of type " + v.type_name() + " is not JSON serializable");
  }
  return Value::string(
      to_json(flag(a, 99, "sort_keys") ? sort_keys_copy(v) : v, ind, item_sep, key_sep));
}

Value to_int(const Value& v, const Args& a) {
  const Value* dflt = arg(a, 0, "default");
  const Value fallback = dflt ? *dflt : Value::integer(0);
  switch (v.type) {
    case Type::kInt:
      return v;
    case Type::kBool:
      return Value::integer(v.as_int());
    case Type::kFloat:
      if (!std::isfinite(v.f) || std::fabs(v.f) > 9.2e18) return fallback;
      return Value::integer(static_cast<int64_t>(v.f));
    case Type::kString: {
      std::string s = py_strip(v.s, nullptr, true, true);
      std::string digits;
      for (char c : s) {
        if (c != '_') digits.push_back(c);
      }
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(digits.c_str(), &end, 10);
      if (!digits.empty() && end && *end == '\0' && errno == 0) return Value::integer(x);
      const double d = std::strtod(digits.c_str(), &end);
      if (!digits.empty() && end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) {
        return Value::integer(static_cast<int64_t>(d));
      }
      return fallback;
    }
    default:
      return fallback;
  }
}

Value to_float(const Value& v, const Args& a) {
  const Value* dflt = arg(a, 0, "default");
  const Value fallback = dflt ? *dflt : Value::real(0.0);
  if (v.is_number()) return Value::real(v.as_double());
  if (v.type == Type::kString) {
    const std::string s = py_strip(v.s, nullptr, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value::real(d);
  }
  return fallback;
}

Value select_items(const Value& seq, const Args& a, bool by_attr, bool keep) {
  List out;
  const size_t first_test = by_attr ? 1 : 0;
  std::string attr;
  if (by_attr) {
    const Value* at = arg(a, 0, nullptr);
    if (!at || at->type != Type::kString)
      eval_fail("selectattr/rejectattr needs an attribute name");
    attr = at->s;
  }
  const Value* test = a.positional.size() > first_test ? &a.positional[first_test] : nullptr;
  if (test && test->type != Type::kString) eval_fail("the test name must be a string");
  const Args targs = rest_args(a, first_test + 1);
  for (const Value& item : iterate(seq)) {
    const Value v = by_attr ? attribute(item, attr) : item;
    const bool pass = test ? apply_test(test->s, v, targs) : v.truthy();
    if (pass == keep) out.push_back(item);
  }
  return Value::new_list(std::move(out));
}

Value map_items(const Value& seq, const Args& a) {
  List out;
  const Value* attr = a.get(99, "attribute");
  if (attr) {
    if (attr->type != Type::kString) eval_fail("map attribute must be a string");
    const Value* dflt = a.get(99, "default");
    for (const Value& item : iterate(seq)) {
      Value v = attribute(item, attr->s);
      out.push_back(v.is_undefined() && dflt ? *dflt : v);
    }
    return Value::new_list(std::move(out));
  }
  const Value* name = arg(a, 0, nullptr);
  if (!name || name->type != Type::kString) eval_fail("map needs a filter name or attribute=");
  const Args fargs = rest_args(a, 1);
  for (const Value& item : iterate(seq)) out.push_back(apply_filter(name->s, item, fargs));
  return Value::new_list(std::move(out));
}

Value sort_items(const Value& seq, const Args& a) {
  List items = iterate(seq);
  const bool reverse = flag(a, 0, "reverse");
  const bool case_sensitive = flag(a, 1, "case_sensitive");
  const Value* attr = a.get(2, "attribute");
  auto key = [&](const Value& v) {
    Value k = attr && attr->type == Type::kString ? attribute(v, attr->s) : v;
    if (!case_sensitive && k.type == Type::kString) k = Value::string(py_case(k.s, 0));
    return k;
  };
  bool ok = true;
  charge_work(sort_comparisons(items.size()));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    bool o = true;
    const bool r = reverse ? less(key(y), key(x), &o) : less(key(x), key(y), &o);
    if (!o) ok = false;
    return r;
  });
  if (!ok) eval_fail("'<' not supported between these values");
  return Value::new_list(std::move(items));
}

Value min_max(const Value& seq, bool want_max) {
  const List items = iterate(seq);
  charge_work(items.size());
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  Value best = items[0];
  for (const Value& v : items) {
    bool ok = true;
    const bool better = want_max ? less(best, v, &ok) : less(v, best, &ok);
    if (!ok) eval_fail("'<' not supported between these values");
    if (better) best = v;
  }
  return best;
}

Value indent(const Value& v, const Args& a) {
  const Value* w = arg(a, 0, "width");
  std::string pad = w && w->type == Type::kString
                        ? w->s
                        : std::string(w && w->type == Type::kInt
                                          ? static_cast<size_t>(std::clamp<int64_t>(w->i, 0, 256))
                                          : 4,
                                      ' ');
  const bool first = flag(a, 1, "first"), blank = flag(a, 2, "blank");
  const std::string s = v.str();
  std::string out;
  size_t at = 0;
  bool line0 = true;
  while (at <= s.size()) {
    size_t nl = s.find('\n', at);
    const std::string line = s.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    if ((line0 ? first : true) && (blank || !line.empty())) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    at = nl + 1;
    line0 = false;
    if (out.size() > kMaxStringBytes) limit_fail(string_limit_message());
  }
  return Value::string(std::move(out));
}

}  // namespace

bool has_filter(const std::string& n) {
  static const char* kNames[] = {
      "trim",       "tojson",  "length",    "count",   "items", "join",   "upper",  "lower",
      "capitalize", "title",   "replace",   "default", "d",     "first",  "last",   "selectattr",
      "rejectattr", "select",  "reject",    "map",     "list",  "string", "int",    "float",
      "abs",        "reverse", "unique",    "sort",    "min",   "max",    "indent", "safe",
      "e",          "escape",  "wordcount", "sum"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

Value apply_filter(const std::string& n, const Value& v, const Args& a) {
  if (n == "trim") {
    if (v.is_undefined()) return Value::string("");
    return Value::string(py_strip(v.str(), arg(a, 0, "chars"), true, true));
  }
  if (n == "tojson") return tojson(v, a);
  if (n == "length" || n == "count") return Value::integer(length(v));
  if (n == "items") {
    if (v.is_undefined()) return Value::new_list();
    if (v.type != Type::kDict) eval_fail("items filter expects a mapping");
    return get_method(v, "items").fn->operator()(Args{});
  }
  if (n == "join") {
    const Value* sep = arg(a, 0, "d");
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += sep ? sep->str() : "";
      out += (attr && attr->type == Type::kString ? attribute(item, attr->s) : item).str();
      first = false;
      if (out.size() > kMaxStringBytes) limit_fail(string_limit_message());
    }
    return Value::string(std::move(out));
  }
  if (n == "upper" || n == "lower" || n == "capitalize" || n == "title") {
    return Value::string(py_case(v.str(), n == "lower"   ? 0
                                          : n == "upper" ? 1
                                          : n == "title" ? 2
                                                         : 3));
  }
  if (n == "replace") {
    const Value* from = arg(a, 0, "old");
    const Value* to = arg(a, 1, "new");
    const Value* count = arg(a, 2, "count");
    if (!from || !to) eval_fail("replace needs two arguments");
    return Value::string(py_replace(v.str(), from->str(), to->str(),
                                    count && count->type == Type::kInt ? count->i : -1));
  }
  if (n == "default" || n == "d") {
    const Value* dflt = arg(a, 0, "default_value");
    const bool boolean = flag(a, 1, "boolean");
    if (v.is_undefined() || (boolean && !v.truthy())) return dflt ? *dflt : Value::string("");
    return v;
  }
  if (n == "first" || n == "last") {
    const List items = iterate(v);
    if (items.empty()) return Value::undefined("No " + n + " item, sequence was empty.");
    return n == "first" ? items.front() : items.back();
  }
  if (n == "selectattr" || n == "rejectattr") return select_items(v, a, true, n == "selectattr");
  if (n == "select" || n == "reject") return select_items(v, a, false, n == "select");
  if (n == "map") return map_items(v, a);
  if (n == "list") return Value::new_list(iterate(v));
  if (n == "string") return Value::string(v.str());
  if (n == "safe" || n == "e" || n == "escape") {
    if (n != "safe") eval_fail("the escape filter is not supported (autoescape is off)");
    return v;
  }
  if (n == "int") return to_int(v, a);
  if (n == "float") return to_float(v, a);
  if (n == "abs") {
    if (v.type == Type::kFloat) return Value::real(std::fabs(v.f));
    if (v.is_number()) return Value::integer(std::llabs(v.as_int()));
    eval_fail("bad operand type for abs(): '" + v.type_name() + "'");
  }
  if (n == "reverse") {
    if (v.type == Type::kString) {
      std::vector<std::string> cps = code_points(v.s);
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::string(out);
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::new_list(std::move(items));
  }
  if (n == "unique") {
    List out;
    for (const Value& x : iterate(v)) {
      charge_work(out.size());
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(y, x); }))
        out.push_back(x);
    }
    return Value::new_list(std::move(out));
  }
  if (n == "sort") return sort_items(v, a);
  if (n == "min" || n == "max") return min_max(v, n == "max");
  if (n == "indent") return indent(v, a);
  if (n == "wordcount") {
    return Value::integer(
        length(get_method(Value::string(v.str()), "split").fn->operator()(Args{})));
  }
  if (n == "sum") {
    Value total = a.get(1, "start") ? *a.get(1, "start") : Value::integer(0);
    for (const Value& x : iterate(v)) total = binary_op("+", total, x);
    return total;
  }
  eval_fail("filter '" + n + "' is not supported");
}

bool has_test(const std::string& n) {
  static const char* kNames[] = {
      "defined", "undefined",   "none",     "string",  "mapping", "iterable", "sequence",
      "number",  "integer",     "float",    "boolean", "true",    "false",    "equalto",
      "eq",      "==",          "ne",       "!=",      "lt",      "<",        "le",
      "<=",      "gt",          ">",        "ge",      ">=",      "in",       "odd",
      "even",    "divisibleby", "callable", "lower",   "upper",   "sameas"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

bool apply_test(const std::string& n, const Value& v, const Args& a) {
  const Value* other = arg(a, 0, nullptr);
  auto need = [&]() -> const Value& {
    if (!other) eval_fail("test '" + n + "' needs an argument");
    return *other;
  };
  auto order = [&](bool want_less, bool or_equal) {
    const Value& o = need();
    bool ok = true;
    const bool r = want_less ? less(v, o, &ok) : less(o, v, &ok);
    if (!ok)
      eval_fail("'<' not supported between '" + v.type_name() + "' and '" + o.type_name() + "'");
    return r || (or_equal && equal(v, o));
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.type == Type::kNone;
  if (n == "string") return v.type == Type::kString;
  if (n == "mapping") return v.type == Type::kDict;
  if (n == "iterable") {
    return v.type == Type::kString || v.type == Type::kList || v.type == Type::kDict ||
           v.is_undefined();
  }
  if (n == "sequence")
    return v.type == Type::kString || v.type == Type::kList || v.type == Type::kDict;
  if (n == "number") return v.is_number();
  if (n == "integer") return v.type == Type::kInt;
  if (n == "float") return v.type == Type::kFloat;
  if (n == "boolean") return v.type == Type::kBool;
  if (n == "true") return v.type == Type::kBool && v.b;
  if (n == "false") return v.type == Type::kBool && !v.b;
  if (n == "equalto" || n == "eq" || n == "==") return equal(v, need());
  if (n == "ne" || n == "!=") return !equal(v, need());
  if (n == "lt" || n == "<") return order(true, false);
  if (n == "le" || n == "<=") return order(true, true);
  if (n == "gt" || n == ">") return order(false, false);
  if (n == "ge" || n == ">=") return order(false, true);
  if (n == "in") return contains(need(), v);
  if (n == "odd" || n == "even" || n == "divisibleby") {
    if (v.type != Type::kInt && v.type != Type::kBool)
      eval_fail("test '" + n + "' expects an integer");
    if (n == "divisibleby") {
      const Value& d = need();
      if (!d.is_number() || d.as_int() == 0) eval_fail("divisibleby needs a non-zero integer");
      return v.as_int() % d.as_int() == 0;
    }
    return (v.as_int() % 2 != 0) == (n == "odd");
  }
  if (n == "callable") return v.type == Type::kFunction;
  if (n == "lower" || n == "upper") {
    return v.type == Type::kString && py_case(v.s, n == "lower" ? 0 : 1) == v.s;
  }
  if (n == "sameas") {
    const Value& o = need();
    if (v.type != o.type) return false;
    if (v.type == Type::kNone || v.type == Type::kUndefined) return true;
    if (v.type == Type::kBool) return v.b == o.b;
    return equal(v, o) && (v.list == o.list && v.dict == o.dict);
  }
  eval_fail("test '" + n + "' is not supported");
}

}  // namespace leantune::jinja
