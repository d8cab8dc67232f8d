// Verifiable rewards and the external reward command (see rewards.h).
#include "trainers/online/rewards.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/check.h"
#include "trainers/common/stop_signal.h"

namespace leantune {

namespace {

std::string collapse_space(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

// The number an answer reads as (commas, '$' and a trailing '.' dropped), when it reads as one.
std::optional<double> as_number(std::string s) {
  s = collapse_space(s);
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return c == ',' || c == '$'; }), s.end());
  while (!s.empty() && (s.back() == '.' || s.back() == ' ')) s.pop_back();
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The content of the last \boxed{...}, braces nested.
std::optional<std::string> last_boxed(const std::string& t) {
  const size_t at = t.rfind("\\boxed{");
  if (at == std::string::npos) return std::nullopt;
  int depth = 0;
  const size_t begin = at + 7;
  for (size_t i = begin; i < t.size(); ++i) {
    if (t[i] == '{') ++depth;
    if (t[i] == '}' && depth-- == 0) return t.substr(begin, i - begin);
  }
  return std::nullopt;  // unclosed
}

std::optional<std::string> last_number(const std::string& t) {
  static const std::regex number(R"([-+]?\$?\d[\d,]*(\.\d+)?)");
  std::optional<std::string> last;
  for (auto it = std::sregex_iterator(t.begin(), t.end(), number); it != std::sregex_iterator();
       ++it)
    last = it->str();
  return last;
}

// '.' outside a bracket expression (and not escaped) becomes [\s\S]: Python's DOTALL.
std::string dotall(const std::string& p) {
  std::string out;
  bool bracket = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      out += c;
      out += p[++i];
      continue;
    }
    if (c == '[') bracket = true;
    if (c == ']') bracket = false;
    out += (c == '.' && !bracket) ? std::string("[\\s\\S]") : std::string(1, c);
  }
  return out;
}

}  // namespace

std::optional<std::string> final_answer(const std::string& text) {
  if (auto b = last_boxed(text)) return collapse_space(*b);
  const size_t hashes = text.rfind("####");
  if (hashes != std::string::npos) {
    std::string rest = text.substr(hashes + 4);
    rest = collapse_space(rest.substr(0, rest.find('\n')));
    if (!rest.empty()) return rest;
  }
  return last_number(text);
}

double accuracy_reward(const std::string& completion, const std::string& solution) {
  const std::optional<std::string> want = final_answer(solution);
  const std::optional<std::string> got = final_answer(completion);
  if (!want || !got) return 0.0;
  const std::optional<double> a = as_number(*got), b = as_number(*want);
  if (a && b) return std::abs(*a - *b) <= 1e-6 * std::max(1.0, std::abs(*b)) ? 1.0 : 0.0;
  return collapse_space(*got) == collapse_space(*want) ? 1.0 : 0.0;
}

FormatReward::FormatReward(const std::string& pattern) : pattern_(pattern) {
  try {
    re_ = std::regex(dotall(pattern), std::regex::ECMAScript | std::regex::multiline);
  } catch (const std::regex_error& e) {
    LT_THROW(ErrorKind::kInput, "format reward pattern '", pattern, "': ", e.what());
  }
}

double FormatReward::operator()(const std::string& completion) const {
  return std::regex_search(completion, re_, std::regex_constants::match_continuous) ? 1.0 : 0.0;
}

double soft_overlong_punishment(int64_t length, int64_t max_len, int64_t cache) {
  if (length <= max_len - cache) return 0.0;
  if (length <= max_len)
    return static_cast<double>(max_len - cache - length) / static_cast<double>(cache);
  return -1.0;
}

namespace {
std::string seconds_text(double s) {
  char t[32];
  std::snprintf(t, sizeof t, "%g", s);
  return t;
}
}  // namespace

RewardCommand::RewardCommand(std::string command, double timeout_seconds, std::string what)
    : command_(std::move(command)), what_(std::move(what)), timeout_(timeout_seconds) {
  LT_CHECK_INPUT(!command_.empty(), what_, ": empty");
  LT_CHECK_INPUT(timeout_ > 0, what_, " '", command_, "': timeout ", timeout_, " must be positive");
  child_ = std::make_unique<ChildProcess>(command_, what_ + " '" + command_ + "'");
}

RewardCommand::~RewardCommand() = default;

void RewardCommand::fail(const std::string& why, bool exited) {
  std::string status;
  if (child_) {
    if (exited) status = child_->wait_exit(1.0).value_or("");
    child_->end();
    child_.reset();
  }
  LT_THROW(ErrorKind::kInput, what_, " '", command_, "': ", why, status);
}

bool RewardCommand::drain() {
  char buf[4096];
  while (true) {
    const ssize_t r = ::recv(child_->fd(), buf, sizeof(buf), 0);
    if (r > 0) {
      buffer_.append(buf, static_cast<size_t>(r));
      continue;
    }
    if (r == 0 || errno == EPIPE || errno == ECONNRESET) return false;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    if (errno != EINTR) fail(std::string("read: ") + std::strerror(errno));
  }
}

void RewardCommand::check_no_extra_answers(size_t inputs, int64_t batch) {
  if (buffer_.empty()) return;
  std::string line = buffer_.substr(0, buffer_.find('\n'));
  fail("output line " + std::to_string(lines_ + 1) + " ('" + line.substr(0, 60) +
       "') is more answers than the " + std::to_string(inputs) + " inputs of batch " +
       std::to_string(batch) + " (one answer per input line)");
}

std::vector<double> RewardCommand::score(const std::vector<nlohmann::json>& rows,
                                         const std::function<bool()>& should_stop) {
  if (!child_) fail("not running (an earlier error ended it)");
  // Answers to the previous batch that came after its last one.
  const bool open = drain();
  if (batches_ > 0) check_no_extra_answers(last_inputs_, batches_);
  if (!open) fail("exited before batch " + std::to_string(batches_ + 1), true);
  const int64_t batch = ++batches_;
  last_inputs_ = rows.size();
  std::string out;
  for (const nlohmann::json& r : rows) out += r.dump() + "\n";
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_));
  const std::string of_batch =
      " of " + std::to_string(rows.size()) + " of batch " + std::to_string(batch);
  size_t sent = 0;
  std::vector<double> rewards;
  while (rewards.size() < rows.size()) {
    // Complete lines already read.
    size_t nl;
    while (rewards.size() < rows.size() && (nl = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      ++lines_;
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
        line.pop_back();
      size_t b = 0;
      while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
      line = line.substr(b);
      if (line == "null") {
        rewards.push_back(std::nan(""));
        continue;
      }
      char* end = nullptr;
      const double v = std::strtod(line.c_str(), &end);
      if (line.empty() || end != line.c_str() + line.size() || !std::isfinite(v))
        fail("output line " + std::to_string(lines_) + " ('" + line.substr(0, 60) +
             "') is not a finite number or null (answer " + std::to_string(rewards.size() + 1) +
             of_batch + ")");
      rewards.push_back(v);
    }
    if (rewards.size() == rows.size()) break;
    if (should_stop && should_stop()) throw StopRequested();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      fail(std::to_string(rewards.size()) + " answer(s)" + of_batch + " within " +
           seconds_text(timeout_) + " s (--reward_timeout; " + std::to_string(lines_) +
           " output line(s) read so far)");
    pollfd p{child_->fd(), static_cast<short>(POLLIN | (sent < out.size() ? POLLOUT : 0)), 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (n < 0 && errno != EINTR) fail(std::string("poll: ") + std::strerror(errno));
    if (n <= 0) continue;
    const std::string exited =
        "exited after " + std::to_string(rewards.size()) + " answer(s)" + of_batch;
    auto gone = [](int e) { return e == EPIPE || e == ECONNRESET; };
    if ((p.revents & POLLOUT) && sent < out.size()) {
      const ssize_t w = ::send(child_->fd(), out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (w < 0 && gone(errno)) fail(exited, true);
      if (w < 0 && errno != EAGAIN && errno != EINTR)
        fail(std::string("write: ") + std::strerror(errno));
      if (w > 0) sent += static_cast<size_t>(w);
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const size_t had = buffer_.size();
      if (!drain() && buffer_.size() == had) fail(exited, true);
    }
  }
  // Answers beyond this batch's inputs that have already come.
  drain();
  check_no_extra_answers(rows.size(), batch);
  return rewards;
}

}  // namespace leantune
