// Values of the Jinja2 interpreter (loaders/jinja/interpreter.h), with Python's semantics where
// chat templates can observe them: int vs float, str()/repr() text, truthiness, equality and
// ordering, insertion-ordered dicts (JSON objects keep their key order, as Python dicts do).
//
// Lists, dicts and namespaces are shared by reference (Python objects are): `set ns.x = ...`
// changes the namespace every holder sees. Strings are UTF-8 bytes; len() and slicing count
// code points, as Python's str does. Strings are held by value: during a rendering, every
// string made or copied and every list or dict made counts against its budget (budget.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loaders/jinja/budget.h"

namespace leantune::jinja {

struct Value;
using List = std::vector<Value>;
// Insertion-ordered string-keyed map (chat data are JSON objects; keys are strings).
using Dict = std::vector<std::pair<std::string, Value>>;

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at position i, else the keyword `name`, else nullptr.
  const Value* get(size_t i, const char* name) const;
};
using Function = std::function<Value(const Args&)>;

enum class Type {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kFunction
};

struct Value {
  Type type = Type::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                 // kString; kUndefined: the name that was undefined
  std::shared_ptr<List> list;    // kList
  bool tuple = false;            // kList made as a Python tuple (repr "(a, b)")
  std::shared_ptr<Dict> dict;    // kDict, kNamespace
  std::shared_ptr<Function> fn;  // kFunction

  Value() = default;
  // A copy copies the string: its bytes count against the rendering's budget.
  Value(const Value& o)
      : type(o.type),
        b(o.b),
        i(o.i),
        f(o.f),
        s(o.s),
        list(o.list),
        tuple(o.tuple),
        dict(o.dict),
        fn(o.fn) {
    if (!s.empty()) charge_bytes(s.size());
  }
  Value& operator=(const Value& o) {
    if (this != &o) *this = Value(o);
    return *this;
  }
  Value(Value&&) noexcept = default;
  Value& operator=(Value&&) noexcept = default;
  ~Value() = default;

  static Value undefined(std::string name = "") {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() { return make(Type::kNone); }
  static Value boolean(bool x) {
    Value v = make(Type::kBool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Type::kInt);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = make(Type::kFloat);
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    charge_bytes(sizeof(Value) + x.size());
    Value v = make(Type::kString);
    v.s = std::move(x);
    return v;
  }
  static Value new_list(List items = {}) {
    charge_bytes(sizeof(Value) * (1 + items.size()));
    Value v = make(Type::kList);
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value new_tuple(List items) {
    Value v = new_list(std::move(items));
    v.tuple = true;
    return v;
  }
  static Value new_dict(Dict items = {}, Type t = Type::kDict) {
    charge_bytes(sizeof(Value) + sizeof(Dict::value_type) * items.size());
    Value v = make(t);
    v.dict = std::make_shared<Dict>(std::move(items));
    return v;
  }
  static Value function(Function f) {
    Value v = make(Type::kFunction);
    v.fn = std::make_shared<Function>(std::move(f));
    return v;
  }
  // JSON -> Value. Use nlohmann::ordered_json to keep the objects' key order (transformers'
  // tojson prints keys in the order the data had them); nlohmann::json sorts them.
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return type == Type::kUndefined; }
  bool is_number() const {
    return type == Type::kInt || type == Type::kFloat || type == Type::kBool;
  }
  bool is_mapping() const { return type == Type::kDict; }
  double as_double() const { return type == Type::kFloat ? f : static_cast<double>(as_int()); }
  int64_t as_int() const { return type == Type::kBool ? (b ? 1 : 0) : i; }

  // Dict lookup; nullptr when absent (or not a dict/namespace).
  const Value* find(const std::string& key) const;
  // Adds or replaces an entry (a new entry counts against the rendering's budget).
  void set(const std::string& key, Value v);

  bool truthy() const;
  // Python str() and repr().
  std::string str() const;
  std::string repr() const;
  std::string type_name() const;

 private:
  static Value make(Type t) {
    Value v;
    v.type = t;
    return v;
  }
};

bool equal(const Value& a, const Value& b);
// Python's a < b; throws (through the caller's error hook) for unordered types: returns false
// and sets *ok=false then.
bool less(const Value& a, const Value& b, bool* ok);

// Python repr(float) (shortest round-trip digits, 'e+XX' exponents, '.0' for integral values).
std::string format_float(double x);
// The longest string a rendering makes (repr() and to_json() included), and the most items of a
// list it makes in one operation.
constexpr size_t kMaxStringBytes = size_t{64} << 20;
constexpr size_t kMaxListItems = size_t{1} << 20;
// The errors for a result past those limits.
std::string string_limit_message();
std::string list_limit_message();

// json.dumps(x, ensure_ascii=False, indent, separators, sort_keys=False).
std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep);

// `s` with newlines and other control characters escaped, cut to 200 bytes: error messages
// quote template text and stay one line.
std::string one_line(const std::string& s);

// Code-point helpers for Python-style string length, indexing and slicing. code_points builds a
// string per code point (charged to the rendering); the others walk the bytes.
std::vector<std::string> code_points(const std::string& s);
// The byte length of the UTF-8 sequence that starts with byte c (1 for a stray byte).
size_t utf8_length(unsigned char c);
size_t count_code_points(const std::string& s);

}  // namespace leantune::jinja
