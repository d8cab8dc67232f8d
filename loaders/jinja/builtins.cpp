// Python operators, iteration, subscripting and the str/dict methods chat templates call
// (see builtins.h). Filters and tests are in filters.cpp.
#include "loaders/jinja/builtins.h"

#include <cmath>

namespace leantune::jinja {

std::string undefined_message(const Value& u) { return u.s.empty() ? "value is undefined" : u.s; }

namespace {

void check_size(size_t n) {
  if (n > kMaxStringBytes) limit_fail(string_limit_message());
}

bool is_py_space(const std::string& cp) {
  return cp == " " || cp == "\t" || cp == "\n" || cp == "\r" || cp == "\v" || cp == "\f" ||
         cp == "\x1c" || cp == "\x1d" || cp == "\x1e" || cp == "\x1f" || cp == "\x85" ||
         cp == "\xc2\x85" || cp == "\xc2\xa0" || cp == "\xe3\x80\x80" || cp == "\xe2\x80\xa8" ||
         cp == "\xe2\x80\xa9" ||
         (cp.size() == 3 && cp[0] == '\xe2' && cp[1] == '\x80' &&
          static_cast<unsigned char>(cp[2]) >= 0x80 && static_cast<unsigned char>(cp[2]) <= 0x8a) ||
         cp == "\xe2\x80\xaf" || cp == "\xe2\x81\x9f" || cp == "\xe1\x9a\x80";
}

// Python str.strip/lstrip/rstrip (chars=None strips Unicode whitespace). Walks the code points
// in place: a long message's trim builds no per-code-point pieces.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<std::string> set;
  const bool ws = !chars || chars->type == Type::kNone || chars->is_undefined();
  if (!ws) {
    if (chars->type != Type::kString) eval_fail("strip arg must be None or str");
    set = code_points(chars->s);
  }
  auto strippable = [&](const std::string& cp) {
    if (ws) return is_py_space(cp);
    charge_work(set.size());
    for (const auto& c : set) {
      if (c == cp) return true;
    }
    return false;
  };
  charge_scan(s.size());
  size_t b = 0, e = right ? 0 : s.size(), k = 0;
  bool leading = left;
  while (k < s.size()) {
    const size_t n = std::min(utf8_length(static_cast<unsigned char>(s[k])), s.size() - k);
    const bool strip_it = strippable(s.substr(k, n));
    if (leading && strip_it) {
      b = k + n;
    } else {
      leading = false;
      if (!right) break;
      if (!strip_it) e = k + n;
    }
    k += n;
  }
  if (e < b) e = b;  // everything was strippable
  return s.substr(b, e - b);
}

Value split(const std::string& s, const Value* sep, const Value* maxsplit) {
  int64_t max = maxsplit && maxsplit->type == Type::kInt ? maxsplit->i : -1;
  List out;
  if (!sep || sep->type == Type::kNone) {
    const std::vector<std::string> cps = code_points(s);
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && is_py_space(cps[k])) ++k;
      if (k >= cps.size()) break;
      std::string word;
      if (max == 0) {
        for (; k < cps.size(); ++k) word += cps[k];
        // Python keeps trailing whitespace of the unsplit remainder stripped on the right.
        out.push_back(Value::string(strip(word, nullptr, false, true)));
        break;
      }
      while (k < cps.size() && !is_py_space(cps[k])) word += cps[k++];
      out.push_back(Value::string(word));
      if (max > 0) --max;
    }
    return Value::new_list(std::move(out));
  }
  if (sep->type != Type::kString) eval_fail("split separator must be a string");
  if (sep->s.empty()) eval_fail("empty separator");
  size_t at = 0;
  while (true) {
    const size_t hit = max == 0 ? std::string::npos : s.find(sep->s, at);
    if (hit == std::string::npos) {
      out.push_back(Value::string(s.substr(at)));
      break;
    }
    out.push_back(Value::string(s.substr(at, hit - at)));
    if (out.size() > kMaxListItems) limit_fail("split: " + list_limit_message());
    at = hit + sep->s.size();
    if (max > 0) --max;
  }
  return Value::new_list(std::move(out));
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {
    const std::vector<std::string> cps = code_points(s);
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || static_cast<int64_t>(k) < count) out += to;
      if (k < cps.size()) out += cps[k];
      check_size(out.size());
    }
    return out;
  }
  size_t at = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(from, at);
    if (hit == std::string::npos) break;
    out += s.substr(at, hit - at) + to;
    check_size(out.size());
    at = hit + from.size();
  }
  return out + s.substr(at);
}

bool affix(const std::string& s, const Value& v, bool prefix) {
  auto one = [&](const Value& x) {
    if (x.type != Type::kString)
      eval_fail("startswith/endswith takes a string or tuple of strings");
    charge_scan(x.s.size());
    if (x.s.size() > s.size()) return false;
    return prefix ? s.compare(0, x.s.size(), x.s) == 0
                  : s.compare(s.size() - x.s.size(), x.s.size(), x.s) == 0;
  };
  if (v.type == Type::kList) {
    for (const Value& x : *v.list) {
      if (one(x)) return true;
    }
    return false;
  }
  return one(v);
}

std::string case_map(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
  std::string out = s;
  bool word_start = true;
  for (size_t k = 0; k < out.size(); ++k) {
    char& c = out[k];
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (mode == 0)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (mode == 1)
      c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    else if (mode == 2) {
      c = static_cast<char>(word_start ? std::toupper(static_cast<unsigned char>(c))
                                       : std::tolower(static_cast<unsigned char>(c)));
      word_start = !alpha;
    } else {
      c = static_cast<char>(k == 0 ? std::toupper(static_cast<unsigned char>(c))
                                   : std::tolower(static_cast<unsigned char>(c)));
    }
  }
  return out;
}

Value bound(Function f) { return Value::function(std::move(f)); }

}  // namespace

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  return strip(s, chars, left, right);
}
std::string py_case(const std::string& s, int mode) { return case_map(s, mode); }
std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  return replace(s, from, to, count);
}

Value get_method(const Value& obj, const std::string& name) {
  if (obj.type == Type::kString) {
    charge_bytes(obj.s.size());  // the bound method keeps a copy
    const std::string s = obj.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool l = name != "rstrip", r = name != "lstrip";
      return bound(
          [s, l, r](const Args& a) { return Value::string(strip(s, a.get(0, "chars"), l, r)); });
    }
    if (name == "split") {
      return bound([s](const Args& a) { return split(s, a.get(0, "sep"), a.get(1, "maxsplit")); });
    }
    if (name == "startswith" || name == "endswith") {
      const bool prefix = name == "startswith";
      return bound([s, prefix](const Args& a) {
        const Value* v = a.get(0, nullptr);
        if (!v) eval_fail("startswith/endswith needs an argument");
        return Value::boolean(affix(s, *v, prefix));
      });
    }
    if (name == "replace") {
      return bound([s](const Args& a) {
        const Value* from = a.get(0, nullptr);
        const Value* to = a.get(1, nullptr);
        const Value* count = a.get(2, "count");
        if (!from || !to || from->type != Type::kString || to->type != Type::kString) {
          eval_fail("replace takes two strings");
        }
        return Value::string(
            replace(s, from->s, to->s, count && count->type == Type::kInt ? count->i : -1));
      });
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      const int mode = name == "lower" ? 0 : name == "upper" ? 1 : name == "title" ? 2 : 3;
      return bound([s, mode](const Args&) { return Value::string(case_map(s, mode)); });
    }
    if (name == "find" || name == "count") {
      const bool find = name == "find";
      return bound([s, find](const Args& a) {
        const Value* sub = a.get(0, nullptr);
        if (!sub || sub->type != Type::kString) eval_fail("find/count takes a string");
        charge_scan(s.size());
        if (find) {
          const size_t at = s.find(sub->s);
          return Value::integer(at == std::string::npos
                                    ? -1
                                    : static_cast<int64_t>(count_code_points(s.substr(0, at))));
        }
        if (sub->s.empty()) return Value::integer(static_cast<int64_t>(count_code_points(s)) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub->s); at != std::string::npos;
             at = s.find(sub->s, at + sub->s.size()))
          ++n;
        return Value::integer(n);
      });
    }
    if (name == "join") {
      return bound([s](const Args& a) {
        const Value* items = a.get(0, nullptr);
        if (!items) eval_fail("join needs an argument");
        std::string out;
        bool first = true;
        for (const Value& v : iterate(*items)) {
          if (v.type != Type::kString) eval_fail("join expects strings");
          if (!first) out += s;
          out += v.s;
          first = false;
          check_size(out.size());
        }
        return Value::string(std::move(out));
      });
    }
    return Value::undefined("'str object' has no attribute '" + name + "'");
  }
  if (obj.type == Type::kDict) {
    const Value d = obj;
    if (name == "get") {
      return bound([d](const Args& a) {
        const Value* key = a.get(0, nullptr);
        const Value* dflt = a.get(1, "default");
        if (!key) eval_fail("get needs a key");
        const Value* hit = key->type == Type::kString ? d.find(key->s) : nullptr;
        return hit ? *hit : dflt ? *dflt : Value::none();
      });
    }
    if (name == "items" || name == "keys" || name == "values") {
      const int what = name == "items" ? 0 : name == "keys" ? 1 : 2;
      return bound([d, what](const Args&) {
        List out;
        for (const auto& [k, v] : *d.dict) {
          if (what == 0)
            out.push_back(Value::new_tuple({Value::string(k), v}));
          else
            out.push_back(what == 1 ? Value::string(k) : v);
        }
        return Value::new_list(std::move(out));
      });
    }
  }
  return Value::undefined();
}

List iterate(const Value& v) {
  switch (v.type) {
    case Type::kUndefined:
      return {};
    case Type::kList:
      charge_bytes(sizeof(Value) * v.list->size());
      return *v.list;
    case Type::kDict: {
      List out;
      for (const auto& kv : *v.dict) out.push_back(Value::string(kv.first));
      return out;
    }
    case Type::kString: {
      List out;
      for (auto& cp : code_points(v.s)) out.push_back(Value::string(cp));
      return out;
    }
    default:
      eval_fail("'" + v.type_name() + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.type) {
    case Type::kUndefined:
      return 0;
    case Type::kString:
      return static_cast<int64_t>(count_code_points(v.s));
    case Type::kList:
      return static_cast<int64_t>(v.list->size());
    case Type::kDict:
      return static_cast<int64_t>(v.dict->size());
    default:
      eval_fail("object of type '" + v.type_name() + "' has no len()");
  }
}

bool contains(const Value& c, const Value& item) {
  switch (c.type) {
    case Type::kString:
      if (item.type != Type::kString) eval_fail("'in <string>' requires string as left operand");
      charge_scan(c.s.size());
      return c.s.find(item.s) != std::string::npos;
    case Type::kList:
      charge_work(c.list->size());
      for (const Value& v : *c.list) {
        if (equal(v, item)) return true;
      }
      return false;
    case Type::kDict:
      return item.type == Type::kString && c.find(item.s) != nullptr;
    case Type::kUndefined:
      eval_fail("argument of type 'Undefined' is not iterable");
    default:
      eval_fail("argument of type '" + c.type_name() + "' is not iterable");
  }
}

namespace {

int64_t index_of(const Value& idx) {
  if (idx.type != Type::kInt && idx.type != Type::kBool) eval_fail("indices must be integers");
  return idx.as_int();
}

// Python slice.indices(n): resolved start, stop, step.
void slice_indices(int64_t n, const Value* start, const Value* stop, const Value* step, int64_t* b,
                   int64_t* e, int64_t* s) {
  auto given = [](const Value* v) { return v && v->type != Type::kNone && !v->is_undefined(); };
  *s = given(step) ? index_of(*step) : 1;
  if (*s == 0) eval_fail("slice step cannot be zero");
  auto clamp = [&](const Value* v, int64_t dflt) {
    if (!given(v)) return dflt;
    int64_t x = index_of(*v);
    if (x < 0) x += n;
    if (*s > 0) return std::max<int64_t>(0, std::min(x, n));
    return std::max<int64_t>(-1, std::min(x, n - 1));
  };
  *b = clamp(start, *s > 0 ? 0 : n - 1);
  *e = clamp(stop, *s > 0 ? n : -1);
}

}  // namespace

Value subscript(const Value& obj, const Value& index) {
  if (obj.type == Type::kDict || obj.type == Type::kNamespace) {
    if (index.type == Type::kString) {
      const Value* v = obj.find(index.s);
      if (v) return *v;
      if (obj.type == Type::kDict) {
        Value m = get_method(obj, index.s);
        if (!m.is_undefined()) return m;
      }
      return Value::undefined("'dict object' has no attribute '" + index.s + "'");
    }
    return Value::undefined("'dict object' has no element " + index.repr());
  }
  if (obj.type == Type::kList || obj.type == Type::kString) {
    if (index.type == Type::kString) {
      Value m = get_method(obj, index.s);
      return m;
    }
    const int64_t n = length(obj);
    int64_t k = index_of(index);
    if (k < 0) k += n;
    if (k < 0 || k >= n)
      return Value::undefined("'" + obj.type_name() + " object' has no element " + index.repr());
    if (obj.type == Type::kList) return (*obj.list)[static_cast<size_t>(k)];
    charge_scan(obj.s.size());
    size_t at = 0;
    for (int64_t c = 0; c < k; ++c)
      at += std::min(utf8_length(static_cast<unsigned char>(obj.s[at])), obj.s.size() - at);
    return Value::string(obj.s.substr(at, utf8_length(static_cast<unsigned char>(obj.s[at]))));
  }
  if (obj.is_undefined()) eval_fail(undefined_message(obj));
  return Value::undefined("'" + obj.type_name() + " object' has no element " + index.repr());
}

Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (obj.type != Type::kList && obj.type != Type::kString) {
    if (obj.is_undefined()) eval_fail(undefined_message(obj));
    eval_fail("'" + obj.type_name() + "' object is not subscriptable");
  }
  const List items = iterate(obj);
  int64_t b, e, s;
  slice_indices(static_cast<int64_t>(items.size()), start, stop, step, &b, &e, &s);
  List out;
  for (int64_t k = b; s > 0 ? k < e : k > e; k += s) out.push_back(items[static_cast<size_t>(k)]);
  if (obj.type == Type::kList) return Value::new_list(std::move(out));
  std::string str;
  for (const Value& v : out) str += v.s;
  return Value::string(str);
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  const bool nums = a.is_number() && b.is_number();
  const bool floats = nums && (a.type == Type::kFloat || b.type == Type::kFloat);
  if (op == "+") {
    if (nums)
      return floats ? Value::real(a.as_double() + b.as_double())
                    : Value::integer(a.as_int() + b.as_int());
    if (a.type == Type::kString && b.type == Type::kString) {
      check_size(a.s.size() + b.s.size());
      return Value::string(a.s + b.s);
    }
    if (a.type == Type::kList && b.type == Type::kList) {
      if (a.list->size() + b.list->size() > kMaxListItems) limit_fail(list_limit_message());
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::new_list(std::move(out));
    }
  } else if (op == "-") {
    if (nums)
      return floats ? Value::real(a.as_double() - b.as_double())
                    : Value::integer(a.as_int() - b.as_int());
  } else if (op == "*") {
    if (nums)
      return floats ? Value::real(a.as_double() * b.as_double())
                    : Value::integer(a.as_int() * b.as_int());
    const Value* str = a.type == Type::kString || a.type == Type::kList ? &a : &b;
    const Value* cnt = str == &a ? &b : &a;
    if ((str->type == Type::kString || str->type == Type::kList) &&
        (cnt->type == Type::kInt || cnt->type == Type::kBool)) {
      const int64_t n = std::max<int64_t>(0, cnt->as_int());
      const bool text = str->type == Type::kString;
      const size_t unit = text ? str->s.size() : str->list->size();
      if (unit > 0 && static_cast<uint64_t>(n) > (text ? kMaxStringBytes : kMaxListItems) / unit)
        limit_fail(text ? string_limit_message() : list_limit_message());
      if (text) {
        std::string out;
        for (int64_t k = 0; k < n; ++k) out += str->s;
        return Value::string(std::move(out));
      }
      List out;
      for (int64_t k = 0; k < n; ++k) out.insert(out.end(), str->list->begin(), str->list->end());
      return Value::new_list(std::move(out));
    }
  } else if (op == "/") {
    if (nums) {
      if (b.as_double() == 0.0) eval_fail("division by zero");
      return Value::real(a.as_double() / b.as_double());
    }
  } else if (op == "//" || op == "%") {
    if (nums) {
      if (b.as_double() == 0.0)
        eval_fail(op == "%" ? "modulo by zero" : "integer division or modulo by zero");
      if (floats) {
        const double q = std::floor(a.as_double() / b.as_double());
        return op == "//" ? Value::real(q) : Value::real(a.as_double() - q * b.as_double());
      }
      const int64_t x = a.as_int(), y = b.as_int();
      if (x == INT64_MIN && y == -1) eval_fail("integer overflow");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return op == "//" ? Value::integer(q) : Value::integer(x - q * y);
    }
  } else if (op == "**") {
    if (nums) {
      if (!floats && b.as_int() >= 0 && b.as_int() < 64) {
        double r = std::pow(static_cast<double>(a.as_int()), static_cast<double>(b.as_int()));
        if (std::fabs(r) < 9.2e18) {
          int64_t out = 1;
          for (int64_t k = 0; k < b.as_int(); ++k) out *= a.as_int();
          return Value::integer(out);
        }
        eval_fail("integer power overflows");
      }
      return Value::real(std::pow(a.as_double(), b.as_double()));
    }
  }
  if (a.is_undefined() || b.is_undefined()) {
    const Value& u = a.is_undefined() ? a : b;
    eval_fail(undefined_message(u));
  }
  eval_fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
            b.type_name() + "'");
}

}  // namespace leantune::jinja
