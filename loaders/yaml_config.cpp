// YAML configs read through libyaml's event parser into JSON (see yaml_config.h).
#include "loaders/yaml_config.h"

#include <yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <regex>

#include "engine/check.h"

namespace leantune {

namespace {

// Owns the parser and the current event.
class Events {
 public:
  Events(std::string_view text, std::string source) : source_(std::move(source)) {
    LT_CHECK(yaml_parser_initialize(&parser_) == 1, "yaml: parser initialisation failed");
    yaml_parser_set_input_string(&parser_, reinterpret_cast<const unsigned char*>(text.data()),
                                 text.size());
  }
  ~Events() {
    if (has_event_) yaml_event_delete(&event_);
    yaml_parser_delete(&parser_);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;

  const yaml_event_t& next() {
    if (has_event_) yaml_event_delete(&event_);
    has_event_ = false;
    if (yaml_parser_parse(&parser_, &event_) != 1)
      LT_THROW(ErrorKind::kInput, source_, ":", parser_.problem_mark.line + 1, ":",
               parser_.problem_mark.column + 1,
               ": YAML: ", parser_.problem ? parser_.problem : "syntax error",
               parser_.context ? std::string(" ") + parser_.context : std::string());
    has_event_ = true;
    return event_;
  }
  // "file:line:column" of the current event.
  std::string where() const {
    return source_ + ":" + std::to_string(event_.start_mark.line + 1) + ":" +
           std::to_string(event_.start_mark.column + 1);
  }

 private:
  std::string source_;
  yaml_parser_t parser_;
  yaml_event_t event_;
  bool has_event_ = false;
};

// YAML 1.2 core schema for plain scalars.
nlohmann::json plain_scalar(const std::string& s) {
  static const std::regex null_re("^(~|null|Null|NULL|)$");
  static const std::regex bool_re("^(true|True|TRUE|false|False|FALSE)$");
  static const std::regex int_re("^[-+]?[0-9]+$");
  static const std::regex oct_re("^0o[0-7]+$");
  static const std::regex hex_re("^0x[0-9a-fA-F]+$");
  static const std::regex float_re(R"(^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$)");
  static const std::regex inf_re(R"(^[-+]?\.(inf|Inf|INF)$)");
  static const std::regex nan_re(R"(^\.(nan|NaN|NAN)$)");
  if (std::regex_match(s, null_re)) return nullptr;
  if (std::regex_match(s, bool_re)) return s[0] == 't' || s[0] == 'T';
  errno = 0;
  if (std::regex_match(s, int_re)) {
    const long long v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == 0) return v;
    return std::strtod(s.c_str(), nullptr);  // beyond 64 bits: a number, as a float
  }
  if (std::regex_match(s, oct_re)) return std::strtoll(s.c_str() + 2, nullptr, 8);
  if (std::regex_match(s, hex_re)) return std::strtoll(s.c_str() + 2, nullptr, 16);
  if (std::regex_match(s, float_re)) return std::strtod(s.c_str(), nullptr);
  if (std::regex_match(s, inf_re))
    return s[0] == '-' ? -std::numeric_limits<double>::infinity()
                       : std::numeric_limits<double>::infinity();
  if (std::regex_match(s, nan_re)) return std::numeric_limits<double>::quiet_NaN();
  return s;
}

nlohmann::json node(Events& ev, const yaml_event_t& e, int depth);

nlohmann::json node_after(Events& ev, int depth) { return node(ev, ev.next(), depth); }

nlohmann::json node(Events& ev, const yaml_event_t& e, int depth) {
  LT_CHECK_INPUT(depth <= 64, ev.where(), ": YAML nested deeper than 64 levels");
  switch (e.type) {
    case YAML_ALIAS_EVENT:
      LT_THROW(ErrorKind::kInput, ev.where(), ": YAML aliases are not supported in a config");
    case YAML_SCALAR_EVENT: {
      LT_CHECK_INPUT(e.data.scalar.anchor == nullptr, ev.where(),
                     ": YAML anchors are not supported in a config");
      const std::string s(reinterpret_cast<const char*>(e.data.scalar.value), e.data.scalar.length);
      return e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && e.data.scalar.tag == nullptr
                 ? plain_scalar(s)
                 : nlohmann::json(s);
    }
    case YAML_SEQUENCE_START_EVENT: {
      LT_CHECK_INPUT(e.data.sequence_start.anchor == nullptr, ev.where(),
                     ": YAML anchors are not supported in a config");
      nlohmann::json a = nlohmann::json::array();
      for (;;) {
        const yaml_event_t& x = ev.next();
        if (x.type == YAML_SEQUENCE_END_EVENT) return a;
        a.push_back(node(ev, x, depth + 1));
      }
    }
    case YAML_MAPPING_START_EVENT: {
      LT_CHECK_INPUT(e.data.mapping_start.anchor == nullptr, ev.where(),
                     ": YAML anchors are not supported in a config");
      nlohmann::json o = nlohmann::json::object();
      for (;;) {
        const yaml_event_t& k = ev.next();
        if (k.type == YAML_MAPPING_END_EVENT) return o;
        LT_CHECK_INPUT(k.type == YAML_SCALAR_EVENT, ev.where(), ": a YAML key must be a string");
        const std::string key(reinterpret_cast<const char*>(k.data.scalar.value),
                              k.data.scalar.length);
        const std::string at = ev.where();
        LT_CHECK_INPUT(!o.contains(key), at, ": duplicate key '", key, "'");
        o[key] = node_after(ev, depth + 1);
      }
    }
    default:
      LT_THROW(ErrorKind::kInput, ev.where(), ": unexpected YAML event");
  }
}

}  // namespace

bool is_yaml_path(const std::string& path) {
  auto ends = [&](const std::string& s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".yaml") || ends(".yml");
}

nlohmann::json parse_yaml_config(std::string_view text, const std::string& source) {
  Events ev(text, source);
  LT_CHECK(ev.next().type == YAML_STREAM_START_EVENT, "yaml: no stream start");
  const yaml_event_t& d = ev.next();
  if (d.type == YAML_STREAM_END_EVENT) return nlohmann::json::object();  // an empty file
  LT_CHECK(d.type == YAML_DOCUMENT_START_EVENT, "yaml: no document start");
  nlohmann::json root = node_after(ev, 0);
  if (root.is_null()) root = nlohmann::json::object();  // a document of comments only
  LT_CHECK(ev.next().type == YAML_DOCUMENT_END_EVENT, "yaml: no document end");
  LT_CHECK_INPUT(ev.next().type == YAML_STREAM_END_EVENT, ev.where(),
                 ": a config holds one YAML document");
  return root;
}

}  // namespace leantune
