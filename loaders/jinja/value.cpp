// Python semantics of jinja values: str()/repr(), truthiness, ==/<, float repr and
// transformers' tojson (json.dumps with ensure_ascii=False, sort_keys=False).
#include "loaders/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "engine/enum_names.h"

namespace leantune::jinja {

const Value* Args::get(size_t idx, const char* name) const {
  if (idx < positional.size()) return &positional[idx];
  if (name) {
    for (const auto& [k, v] : keyword) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

namespace {

template <typename Json>
Value value_from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value::integer(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return Value::real(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(value_from_json(e));
      return Value::new_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict items;
      for (auto it = j.begin(); it != j.end(); ++it)
        items.emplace_back(it.key(), value_from_json(*it));
      return Value::new_dict(std::move(items));
    }
    default:
      return Value::none();
  }
}

}  // namespace

Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }

const Value* Value::find(const std::string& key) const {
  if (!dict || (type != Type::kDict && type != Type::kNamespace)) return nullptr;
  for (const auto& [k, v] : *dict) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::set(const std::string& key, Value v) {
  charge_work(dict->size() / 8);
  for (auto& [k, old] : *dict) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  charge_bytes(sizeof(Dict::value_type) + key.size());
  dict->emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (type) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
      return b;
    case Type::kInt:
      return i != 0;
    case Type::kFloat:
      return f != 0.0;
    case Type::kString:
      return !s.empty();
    case Type::kList:
      return !list->empty();
    case Type::kDict:
      return !dict->empty();
    default:
      return true;
  }
}

std::string format_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  // buf: d.ddde[+-]XX with `prec` significant digits.
  std::string m(buf);
  const size_t e = m.find('e');
  const int exp10 = std::atoi(m.c_str() + e + 1);
  std::string digits;
  for (size_t k = 0; k < e; ++k) {
    if (std::isdigit(static_cast<unsigned char>(m[k]))) digits.push_back(m[k]);
  }
  const bool neg = x < 0 || (x == 0 && std::signbit(x));
  std::string out = neg ? "-" : "";
  if (exp10 < -4 || exp10 >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ex[16];
    std::snprintf(ex, sizeof(ex), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + ex;
  }
  if (exp10 < 0) return out + "0." + std::string(-exp10 - 1, '0') + digits;
  const size_t int_len = static_cast<size_t>(exp10) + 1;
  if (digits.size() <= int_len)
    return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

std::string py_repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// Serialised output beyond the string limit fails as it grows: shared lists and dicts can nest a
// value exponentially many times (`[l, l]` repeated), long before the result is made a Value.
// Checked after every element; each container charges its elements' work.
void check_output(const std::string& out) {
  if (out.size() > kMaxStringBytes) limit_fail(string_limit_message());
}

// The elements of a list or dict, serialised in order by item(element) with `sep` between them;
// their work is charged first and the output's size checked after each.
template <typename Range, typename Item>
void serialise_items(const Range& items, std::string_view sep, std::string& out, Item&& item) {
  charge_work(1 + items.size());
  bool first = true;
  for (const auto& e : items) {
    if (!first) out += sep;
    first = false;
    item(e);
    check_output(out);
  }
}

void json_value(const Value& v, int indent, int depth, const std::string& item_sep,
                const std::string& key_sep, std::string& out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(d), ' ');
  };
  switch (v.type) {
    case Type::kUndefined:
    case Type::kNone:
      out += "null";
      return;
    case Type::kBool:
      out += v.b ? "true" : "false";
      return;
    case Type::kInt:
      out += std::to_string(v.i);
      return;
    case Type::kFloat:
      out += std::isnan(v.f)   ? "NaN"
             : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                               : format_float(v.f);
      return;
    case Type::kString:
      json_string(v.s, out);
      return;
    case Type::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      serialise_items(*v.list, item_sep, out, [&](const Value& e) {
        newline(depth + 1);
        json_value(e, indent, depth + 1, item_sep, key_sep, out);
      });
      newline(depth);
      out += ']';
      return;
    }
    case Type::kDict:
    case Type::kNamespace: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      out += '{';
      serialise_items(*v.dict, item_sep, out, [&](const auto& entry) {
        newline(depth + 1);
        json_string(entry.first, out);
        out += key_sep;
        json_value(entry.second, indent, depth + 1, item_sep, key_sep, out);
      });
      newline(depth);
      out += '}';
      return;
    }
    case Type::kFunction:
      out += "null";
      return;
  }
}

}  // namespace

std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep) {
  std::string out;
  json_value(v, indent, 0, item_sep, key_sep, out);
  return out;
}

std::string Value::str() const {
  switch (type) {
    case Type::kUndefined:
      return "";
    case Type::kString:
      return s;
    default:
      return repr();
  }
}

namespace {

void repr_into(const Value& v, std::string& out) {
  switch (v.type) {
    case Type::kList: {
      out += v.tuple ? "(" : "[";
      serialise_items(*v.list, ", ", out, [&](const Value& e) { repr_into(e, out); });
      if (v.tuple && v.list->size() == 1) out += ",";
      out += v.tuple ? ")" : "]";
      return;
    }
    case Type::kDict: {
      out += "{";
      serialise_items(*v.dict, ", ", out, [&](const auto& entry) {
        out += py_repr_string(entry.first) + ": ";
        repr_into(entry.second, out);
      });
      out += "}";
      return;
    }
    case Type::kUndefined:
      return;
    case Type::kNone:
      out += "None";
      return;
    case Type::kBool:
      out += v.b ? "True" : "False";
      return;
    case Type::kInt:
      out += std::to_string(v.i);
      return;
    case Type::kFloat:
      out += format_float(v.f);
      return;
    case Type::kString:
      out += py_repr_string(v.s);
      return;
    case Type::kNamespace:
      out += "<Namespace>";
      return;
    case Type::kFunction:
      out += "<function>";
      return;
  }
}

}  // namespace

std::string Value::repr() const {
  std::string out;
  repr_into(*this, out);
  return out;
}

std::string Value::type_name() const {
  static constexpr const char* kNames[] = {"undefined", "NoneType", "bool", "int",
                                           "float",     "str",      "list", "dict",
                                           "Namespace", "function"};
  static_assert(std::size(kNames) == static_cast<size_t>(Type::kFunction) + 1);
  return enum_name(type, kNames, "");
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type == Type::kFloat || b.type == Type::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::kUndefined:
    case Type::kNone:
      return true;
    case Type::kString:
      if (a.s.size() != b.s.size()) return false;
      charge_scan(a.s.size());
      return a.s == b.s;
    case Type::kList: {
      if (a.list->size() != b.list->size()) return false;
      charge_work(a.list->size());
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Type::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      charge_work(a.dict->size() * a.dict->size() / 8 + a.dict->size());
      for (const auto& [k, v] : *a.dict) {
        const Value* o = b.find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    }
    default:
      return a.dict == b.dict && a.fn == b.fn;
  }
}

bool less(const Value& a, const Value& b, bool* ok) {
  *ok = true;
  if (a.is_number() && b.is_number()) {
    if (a.type == Type::kFloat || b.type == Type::kFloat) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.type == Type::kString && b.type == Type::kString) {
    charge_scan(std::min(a.s.size(), b.s.size()));
    return a.s < b.s;
  }
  if (a.type == Type::kList && b.type == Type::kList) {
    const size_t n = std::min(a.list->size(), b.list->size());
    charge_work(n);
    for (size_t k = 0; k < n; ++k) {
      if (less((*a.list)[k], (*b.list)[k], ok)) return true;
      if (!*ok) return false;
      if (less((*b.list)[k], (*a.list)[k], ok)) return false;
      if (!*ok) return false;
    }
    return a.list->size() < b.list->size();
  }
  *ok = false;
  return false;
}

std::string string_limit_message() {
  return "result exceeds the size limit of " + std::to_string(kMaxStringBytes >> 20) +
         " MiB for a string";
}

std::string list_limit_message() {
  return "result exceeds the size limit of " + std::to_string(kMaxListItems) + " items for a list";
}

std::string one_line(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= 200) {
      out += "...";
      break;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

size_t utf8_length(unsigned char c) {
  if (c >= 0xF0) return 4;
  if (c >= 0xE0) return 3;
  if (c >= 0xC0) return 2;
  return 1;
}

size_t count_code_points(const std::string& s) {
  charge_scan(s.size());
  size_t n = 0;
  for (size_t k = 0; k < s.size(); ++n)
    k += std::min(utf8_length(static_cast<unsigned char>(s[k])), s.size() - k);
  return n;
}

std::vector<std::string> code_points(const std::string& s) {
  // At most one piece per byte: charged before it is built.
  charge_bytes(s.size() * sizeof(std::string));
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    const size_t n = std::min(utf8_length(static_cast<unsigned char>(s[k])), s.size() - k);
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

}  // namespace leantune::jinja
