// Added tokens of tokenizer.json and the byte trie that finds them: leftmost-longest search, as
// tokenizers' Aho-Corasick with MatchKind::LeftmostLongest. The trie stores token indices
// (positions in the added-token list); matching returns byte ranges of the searched text.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace leantune::tokenizer_detail {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

class TokenTrie {
 public:
  bool empty() const { return nodes_.size() == 1; }
  void add(std::string_view s, int32_t token_index) {
    if (s.empty()) return;
    int32_t node = 0;
    for (unsigned char c : s) {
      int32_t next = child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[node].kids.emplace_back(c, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[node].token = token_index;
    if (!first_[static_cast<unsigned char>(s[0])]) {
      first_[static_cast<unsigned char>(s[0])] = true;
      ++num_first_;
      single_first_ = s[0];
    }
  }
  // The leftmost-longest match starting at or after `from`.
  bool find(std::string_view text, size_t from, size_t& b, size_t& e, int32_t& token) const {
    const size_t n = text.size();
    size_t pos = from;
    while (pos < n) {
      if (num_first_ == 1) {
        const void* p = std::memchr(text.data() + pos, single_first_, n - pos);
        if (!p) return false;
        pos = static_cast<const char*>(p) - text.data();
      } else if (!first_[static_cast<unsigned char>(text[pos])]) {
        ++pos;
        continue;
      }
      int32_t node = 0;
      int32_t best = -1;
      size_t best_end = 0;
      for (size_t i = pos; i < n; ++i) {
        node = child(node, static_cast<unsigned char>(text[i]));
        if (node < 0) break;
        if (nodes_[node].token >= 0) {
          best = nodes_[node].token;
          best_end = i + 1;
        }
      }
      if (best >= 0) {
        b = pos;
        e = best_end;
        token = best;
        return true;
      }
      ++pos;
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> kids;
    int32_t token = -1;
  };
  int32_t child(int32_t node, unsigned char c) const {
    for (const auto& [k, v] : nodes_[node].kids) {
      if (k == c) return v;
    }
    return -1;
  }
  std::vector<Node> nodes_{1};
  bool first_[256] = {};
  int num_first_ = 0;
  char single_first_ = 0;
};

}  // namespace leantune::tokenizer_detail
