// Jinja2 filters, tests, value methods (str.strip, dict.get, ...) and Python operators as the
// interpreter (interpreter.cpp) calls them. They report a bad call by throwing EvalError; the
// interpreter adds the template position. Work beyond what the values they build already count
// (scans, searches, comparisons) is charged to the rendering's budget (budget.h).
#pragma once

#include <string>
#include <vector>

#include "loaders/jinja/value.h"

namespace leantune::jinja {

// The message an undefined value carries ("'x' is undefined", "'dict object' has no
// attribute 'y'") for the error raised when it is used.
std::string undefined_message(const Value& u);

// Python str.strip/lstrip/rstrip (chars: nullptr or None for whitespace), case mapping
// (0 lower, 1 upper, 2 title, 3 capitalize; ASCII letters), str.replace (count < 0: all).
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string py_case(const std::string& s, int mode);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count);

// Filter `name` applied to input (EvalError for an unknown filter or bad arguments).
Value apply_filter(const std::string& name, const Value& input, const Args& args);
bool has_filter(const std::string& name);
// Test `name` (the `x is name(args)` form).
bool apply_test(const std::string& name, const Value& v, const Args& args);
bool has_test(const std::string& name);
// A bound method of a string or dict (str.strip, dict.items, ...); undefined when none.
Value get_method(const Value& obj, const std::string& name);

// Python's binary operators (+ - * / // % **) and `in`.
Value binary_op(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
// Python iteration: list items, dict keys, string code points; undefined iterates nothing.
List iterate(const Value& v);
// len(); EvalError for values without one.
int64_t length(const Value& v);
// Python subscripting / slicing of lists and strings, dict lookup.
Value subscript(const Value& obj, const Value& index);
Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step);

}  // namespace leantune::jinja
