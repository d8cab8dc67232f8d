// A Jinja2 template interpreter for chat templates: renders as jinja2 3.1 does inside
// transformers' apply_chat_template (ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks, the loopcontrols extension, transformers' tojson, raise_exception,
// strftime_now, namespace and dict globals, and the {% generation %} tag that records the
// character spans of assistant text).
//
// Errors (syntax, unknown filter or test, a failing expression, raise_exception, limits) are
// Error(kInput) "<source>:<line>:<col>: <what>". Limits keep hostile templates bounded: nesting
// depth (parser), macro recursion depth, the longest string and list, and a rendering's work and
// size budget (budget.h: about a second, 256 MiB of values). Running out of host memory anyway
// is Error(kOutOfMemory) naming the template.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/check.h"
#include "loaders/jinja/value.h"

namespace leantune::jinja {

// A rendering stopped by a limit (its work or size budget, the longest string or list): the
// template, not the data, is at fault. An Error(kInput) like every other template error.
class TemplateLimitError : public Error {
 public:
  using Error::Error;
};

struct Node;

struct Rendered {
  std::string text;
  // Byte ranges [begin, end) of text produced inside {% generation %} blocks, in order.
  std::vector<std::pair<size_t, size_t>> generation_spans;
  // What the rendering used of its budget (budget.h).
  uint64_t work_units = 0;
  uint64_t built_bytes = 0;
};

class Template {
 public:
  // Parses `text`; `source` names the template in error messages (a file path, or
  // "<config>:chat_template").
  Template(const std::string& text, std::string source);

  // Renders with `context` (a dict: messages, add_generation_prompt, bos_token, ...) as the
  // template's globals. strftime_now() formats `now` when given, else the local time.
  Rendered render(const Value& context, const std::optional<std::tm>& now = std::nullopt) const;

  const std::string& source() const { return source_; }
  // Whether the template has a {% generation %} block.
  bool has_generation() const { return has_generation_; }

 private:
  std::string source_;
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> nodes_;
  bool has_generation_ = false;
};

}  // namespace leantune::jinja
