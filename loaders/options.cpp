// Option declarations, parsing of --config JSON and --flags, and help text (see options.h).
#include "loaders/options.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string_view>

#include "engine/check.h"
#include "loaders/fs_util.h"
#include "loaders/unicode.h"
#include "loaders/yaml_config.h"

namespace leantune {

namespace {
std::string dashes_to_underscores(std::string s) {
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const char* type_name(Options::Type t) {
  switch (t) {
    case Options::Type::kBool:
      return "true or false";
    case Options::Type::kBoolOrNone:
      return "true, false or none";
    case Options::Type::kInt:
      return "an integer";
    case Options::Type::kIntOrNone:
      return "an integer or none";
    case Options::Type::kFloat:
      return "a number";
    case Options::Type::kString:
      return "a string";
    case Options::Type::kStringList:
      return "a list of strings";
  }
  return "?";
}

std::string show(const nlohmann::json& v) {
  if (v.is_null()) return "none";
  if (v.is_string()) return v.get<std::string>().empty() ? "\"\"" : v.get<std::string>();
  if (v.is_array()) {
    std::string s;
    for (const auto& e : v) s += (s.empty() ? "" : ",") + e.get<std::string>();
    return s.empty() ? "\"\"" : s;
  }
  return v.dump();
}

// The range an integer option accepts, for messages.
std::string int_range(double min, double max) {
  const bool has_min = min > -9.2e18, has_max = max < 9.2e18;
  auto i = [](double d) { return std::to_string(static_cast<int64_t>(d)); };
  if (has_min && has_max) return "an integer in [" + i(min) + ", " + i(max) + "]";
  if (has_min) return "an integer >= " + i(min);
  if (has_max) return "an integer <= " + i(max);
  return "an integer in [-9223372036854775808, 9223372036854775807]";
}
}  // namespace

nlohmann::json parse_config_json(std::string_view text, const std::string& source,
                                 std::map<std::string, std::string>* raw_numbers) {
  return parse_json_strict(text, source, 64, raw_numbers, "JSON config");
}

std::string Options::canonical(const std::string& name) const {
  const std::string n = dashes_to_underscores(name);
  const auto it = aliases_.find(n);
  return it == aliases_.end() ? n : it->second;
}

Options& Options::add_alias(const std::string& alias, const std::string& name) {
  Spec& s = spec(name);
  const std::string a = dashes_to_underscores(alias);
  for (const Spec& other : specs_)
    LT_CHECK(other.name != a, command_, ": alias --", a, " is already an option");
  LT_CHECK(aliases_.emplace(a, s.name).second, command_, ": alias --", a, " declared twice");
  s.help += " (also --" + a + ")";
  return *this;
}

Options::Spec& Options::spec(const std::string& name) {
  return const_cast<Spec&>(static_cast<const Options*>(this)->spec(name));
}

const Options::Spec& Options::spec(const std::string& name0) const {
  const std::string name = canonical(name0);
  for (const Spec& s : specs_)
    if (s.name == name) return s;
  std::string best;
  size_t best_d = 4;
  for (const Spec& s : specs_) {
    size_t d = edit_distance(name, s.name);
    if (d < best_d) {
      best_d = d;
      best = s.name;
    }
  }
  LT_THROW(ErrorKind::kInput, command_, ": unknown option --", name,
           best.empty() ? "" : " (did you mean --" + best + "?)");
}

Options& Options::add_bool(const std::string& name, bool def, const std::string& help) {
  specs_.push_back({name, Type::kBool, def, help, {}});
  values_[name] = def;
  return *this;
}
Options& Options::add_bool_or_none(const std::string& name, std::optional<bool> def,
                                   const std::string& help) {
  nlohmann::json d = def ? nlohmann::json(*def) : nlohmann::json(nullptr);
  specs_.push_back({name, Type::kBoolOrNone, d, help, {}});
  values_[name] = d;
  return *this;
}
Options& Options::add_int(const std::string& name, int64_t def, const std::string& help,
                          int64_t min, int64_t max) {
  specs_.push_back(
      {name, Type::kInt, def, help, {}, static_cast<double>(min), static_cast<double>(max)});
  values_[name] = def;
  return *this;
}
Options& Options::add_int_or_none(const std::string& name, std::optional<int64_t> def,
                                  const std::string& help, int64_t min) {
  nlohmann::json d = def ? nlohmann::json(*def) : nlohmann::json(nullptr);
  specs_.push_back({name, Type::kIntOrNone, d, help, {}, static_cast<double>(min)});
  values_[name] = d;
  return *this;
}
Options& Options::add_float(const std::string& name, double def, const std::string& help,
                            double min, double max) {
  specs_.push_back({name, Type::kFloat, def, help, {}, min, max});
  values_[name] = def;
  return *this;
}
Options& Options::add_float_below(const std::string& name, double def, const std::string& help,
                                  double min, double sup) {
  add_float(name, def, help, min, sup);
  specs_.back().max_open = true;
  return *this;
}
Options& Options::add_string(const std::string& name, const std::string& def,
                             const std::string& help, std::vector<std::string> choices) {
  specs_.push_back({name, Type::kString, def, help, std::move(choices)});
  values_[name] = def;
  return *this;
}
Options& Options::add_string_list(const std::string& name, std::vector<std::string> def,
                                  const std::string& help) {
  specs_.push_back({name, Type::kStringList, def, help, {}});
  values_[name] = def;
  return *this;
}
Options& Options::allow_positional(const std::string& name, const std::string& help) {
  positional_name_ = name;
  positional_help_ = help;
  return *this;
}

void Options::set_from_json(Spec& s, const nlohmann::json& v, const std::string& where,
                            const std::string& as_written) {
  const std::string shown = as_written.empty() ? v.dump() : as_written;
  auto bad = [&]() {
    LT_THROW(ErrorKind::kInput, where, ": option ", s.name, " expects ", type_name(s.type),
             ", got ", shown);
  };
  nlohmann::json out;
  switch (s.type) {
    case Type::kBool:
      if (!v.is_boolean()) bad();
      out = v;
      break;
    case Type::kBoolOrNone:
      if (v.is_string() && (v == "none" || v == "None")) {
        out = nullptr;
        break;
      }
      if (!v.is_boolean() && !v.is_null()) bad();
      out = v;
      break;
    case Type::kInt:
    case Type::kIntOrNone:
      if (v.is_null() && s.type == Type::kIntOrNone) {
        out = nullptr;
        break;
      }
      if (v.is_string() && s.type == Type::kIntOrNone && (v == "none" || v == "None")) {
        out = nullptr;
        break;
      }
      {
        auto out_of_range = [&]() {
          LT_THROW(ErrorKind::kInput, where, ": option ", s.name, " must be ",
                   int_range(s.min, s.max), ", got ", shown);
        };
        int64_t x = 0;
        if (v.is_number_unsigned()) {
          if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) out_of_range();
          x = static_cast<int64_t>(v.get<uint64_t>());
        } else if (v.is_number_integer()) {
          x = v.get<int64_t>();
        } else if (v.is_number_float()) {
          const double d = v.get<double>();
          if (!std::isfinite(d) || std::floor(d) != d) bad();
          // 2^63 is the first double past int64; casting it or more is undefined.
          if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) out_of_range();
          x = static_cast<int64_t>(d);
        } else {
          bad();
        }
        if (static_cast<double>(x) < s.min || static_cast<double>(x) > s.max) out_of_range();
        out = x;
      }
      break;
    case Type::kFloat:
      if (!v.is_number()) bad();
      out = v.get<double>();
      if (!std::isfinite(out.get<double>()) || out.get<double>() < s.min ||
          out.get<double>() > s.max || (s.max_open && out.get<double>() == s.max))
        LT_THROW(ErrorKind::kInput, where, ": option ", s.name, " must be a finite number in [",
                 s.min, ", ", s.max, s.max_open ? "), got " : "], got ", shown);
      break;
    case Type::kString:
      if (!v.is_string()) bad();
      out = v;
      if (!s.choices.empty() &&
          std::find(s.choices.begin(), s.choices.end(), v.get<std::string>()) == s.choices.end()) {
        std::string list;
        for (const auto& c : s.choices) list += (list.empty() ? "" : ", ") + c;
        LT_THROW(ErrorKind::kInput, where, ": option ", s.name, " must be one of ", list, "; got '",
                 v.get<std::string>(), "'");
      }
      break;
    case Type::kStringList:
      // Numbers are accepted as their JSON text, so a config can list token ids or loss
      // weights as numbers.
      if (v.is_string()) {
        out = nlohmann::json::array({v});
      } else {
        if (!v.is_array()) bad();
        out = nlohmann::json::array();
        for (const auto& e : v) {
          if (e.is_string())
            out.push_back(e);
          else if (e.is_number())
            out.push_back(e.dump());
          else
            bad();
        }
      }
      break;
  }
  values_[s.name] = out;
  user_set_[s.name] = true;
}

void Options::set_from_text(Spec& s, const std::string& text, const std::string& where) {
  // Every value is kept as JSON text: bytes that are not UTF-8 are refused here, naming the
  // option, not later as an internal JSON error.
  const size_t invalid = unicode::find_invalid(text);
  LT_CHECK_INPUT(invalid == std::string::npos, where, ": option --", s.name,
                 " is not valid UTF-8 (byte ", invalid, ")");
  auto bad = [&]() {
    LT_THROW(ErrorKind::kInput, where, ": option --", s.name, " expects ", type_name(s.type),
             ", got '", text, "'");
  };
  switch (s.type) {
    case Type::kBool:
    case Type::kBoolOrNone: {
      std::string t = text;
      std::transform(t.begin(), t.end(), t.begin(), ::tolower);
      if (t == "true" || t == "1" || t == "yes") return set_from_json(s, true, where);
      if (t == "false" || t == "0" || t == "no") return set_from_json(s, false, where);
      if (s.type == Type::kBoolOrNone && (t == "none" || t == "null"))
        return set_from_json(s, nullptr, where);
      bad();
      break;
    }
    case Type::kInt:
    case Type::kIntOrNone: {
      if (s.type == Type::kIntOrNone && (text == "none" || text == "None" || text == "null"))
        return set_from_json(s, nullptr, where);
      size_t used = 0;
      int64_t v = 0;
      try {
        v = std::stoll(text, &used);
      } catch (const std::out_of_range&) {
        LT_THROW(ErrorKind::kInput, where, ": option --", s.name, " must be ",
                 int_range(s.min, s.max), ", got '", text, "'");
      } catch (...) {
        bad();
      }
      if (used != text.size()) bad();
      return set_from_json(s, v, where, "'" + text + "'");
    }
    case Type::kFloat: {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(text, &used);
      } catch (...) {
        bad();
      }
      if (used != text.size()) bad();
      return set_from_json(s, v, where, "'" + text + "'");
    }
    case Type::kString:
      return set_from_json(s, text, where);
    case Type::kStringList: {
      nlohmann::json arr = nlohmann::json::array();
      std::stringstream ss(text);
      std::string item;
      while (std::getline(ss, item, ','))
        if (!item.empty()) arr.push_back(item);
      return set_from_json(s, arr, where);
    }
  }
}

void Options::apply_json(const nlohmann::json& j, const std::string& source,
                         const std::map<std::string, std::string>& raw_numbers) {
  LT_CHECK_INPUT(j.is_object(), source, ": a config must be a JSON object of option -> value");
  for (auto it = j.begin(); it != j.end(); ++it) {
    Spec& s = spec(it.key());
    auto raw = raw_numbers.find(it.key());
    set_from_json(s, it.value(), source, raw == raw_numbers.end() ? "" : raw->second);
  }
}

void Options::apply_config_text(std::string_view text, const std::string& source) {
  std::map<std::string, std::string> raw;
  const nlohmann::json j = parse_config_json(text, source, &raw);
  apply_json(j, source, raw);
}

bool Options::parse(const std::vector<std::string>& args) {
  // The config file first, so that flags override it whatever their order.
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], path;
    if (a == "--config") {
      LT_CHECK_INPUT(i + 1 < args.size(), command_, ": option --config needs a file");
      path = args[i + 1];
    } else if (a.rfind("--config=", 0) == 0) {
      path = a.substr(9);
    } else {
      continue;
    }
    if (is_yaml_path(path))
      apply_json(parse_yaml_config(read_text_file(path), path), path);
    else
      apply_config_text(read_text_file(path), path);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return false;
    if (a.rfind("--", 0) != 0) {
      LT_CHECK_INPUT(!positional_name_.empty(), command_, ": unexpected argument '", a, "'");
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (canonical(name) == "config") {
      if (!has_value) ++i;
      continue;
    }
    Spec& s = spec(name);
    if (!has_value) {
      const bool next_is_value = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
      if ((s.type == Type::kBool || s.type == Type::kBoolOrNone) && !next_is_value) {
        set_from_json(s, true, "command line");
        continue;
      }
      LT_CHECK_INPUT(next_is_value, command_, ": option --", s.name, " needs a value (",
                     type_name(s.type), ")");
      value = args[++i];
    }
    set_from_text(s, value, "command line");
  }
  return true;
}

bool Options::get_bool(const std::string& name) const {
  return values_.at(spec(name).name).get<bool>();
}
std::optional<bool> Options::get_bool_or_none(const std::string& name) const {
  const auto& v = values_.at(spec(name).name);
  if (v.is_null()) return std::nullopt;
  return v.get<bool>();
}
int64_t Options::get_int(const std::string& name) const {
  return values_.at(spec(name).name).get<int64_t>();
}
std::optional<int64_t> Options::get_int_or_none(const std::string& name) const {
  const auto& v = values_.at(spec(name).name);
  if (v.is_null()) return std::nullopt;
  return v.get<int64_t>();
}
double Options::get_float(const std::string& name) const {
  return values_.at(spec(name).name).get<double>();
}
const std::string& Options::get_string(const std::string& name) const {
  return values_.at(spec(name).name).get_ref<const std::string&>();
}
std::vector<std::string> Options::get_string_list(const std::string& name) const {
  return values_.at(spec(name).name).get<std::vector<std::string>>();
}
bool Options::declared(const std::string& name) const {
  const std::string c = canonical(name);
  for (const Spec& s : specs_)
    if (s.name == c) return true;
  return false;
}
bool Options::is_set(const std::string& name) const {
  auto it = user_set_.find(spec(name).name);
  return it != user_set_.end() && it->second;
}
void Options::set(const std::string& name, const nlohmann::json& value) {
  Spec& s = spec(name);
  set_from_json(s, value, "internal");
  user_set_[s.name] = false;
}

void Options::set_default(const std::string& name, const nlohmann::json& value) {
  set(name, value);
  spec(name).def = value;
}

std::string Options::help() const {
  std::ostringstream os;
  os << "usage: trainer_bin " << command_;
  if (!positional_name_.empty()) os << " " << positional_name_;
  os << " [--config FILE.json|FILE.yaml] [--option value ...]\n\n";
  if (!positional_name_.empty())
    os << "  " << positional_name_ << "\n      " << positional_help_ << "\n";
  os << "options (TRL names; a JSON or YAML config may set any of them, flags override it):\n";
  for (const Spec& s : specs_) {
    os << "  --" << s.name << " (" << type_name(s.type) << ", default " << show(s.def) << ")\n"
       << "      " << s.help;
    if (!s.choices.empty()) {
      os << " [";
      for (size_t i = 0; i < s.choices.size(); ++i) os << (i ? "|" : "") << s.choices[i];
      os << "]";
    }
    os << "\n";
  }
  return os.str();
}

nlohmann::json Options::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const Spec& s : specs_) j[s.name] = values_.at(s.name);
  return j;
}

}  // namespace leantune
