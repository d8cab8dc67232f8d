// The encode pipeline of Hugging Face tokenizers over a loaded Tokenizer::Impl: added tokens
// (raw, then normalized) -> normalizer -> pre-tokenizers (Split, ByteLevel, Digits) -> BPE ->
// post-processor template, with optional byte offsets mapped back to the input text.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "engine/check.h"
#include "loaders/tokenizer_impl.h"

namespace leantune {

using namespace tokenizer_detail;

bool Tokenizer::Impl::normalize(std::string_view in, std::string& out) const {
  bool changed = false;
  std::string tmp;
  for (const NormStep& step : normalizers) {
    const std::string_view cur = changed ? std::string_view(out) : in;
    if (step.kind == NormStep::Kind::kForm) {
      if (unicode::normalize(cur, step.form, tmp)) {
        out.swap(tmp);
        changed = true;
      }
    } else {
      std::string lower = unicode::to_lower(cur);
      if (lower != cur) {
        out.swap(lower);
        changed = true;
      }
    }
  }
  return changed;
}

void Tokenizer::Impl::build_table(std::string_view in, uint32_t ob, SegMap& map) const {
  // Every normalizer supported here maps a chunk that starts at an ASCII character
  // independently of its neighbours (ASCII characters have combining class 0 and are never
  // the second element of a composition), so normalizing chunk by chunk aligns the output: an
  // unchanged chunk maps byte for byte, a changed one maps as a whole.
  map.kind = SegMap::Kind::kTable;
  map.table.clear();
  size_t start = 0;
  std::string norm;
  while (start < in.size()) {
    size_t end = start + 1;
    while (end < in.size() && static_cast<unsigned char>(in[end]) >= 0x80) ++end;
    const std::string_view chunk = in.substr(start, end - start);
    const uint32_t cb = ob + static_cast<uint32_t>(start);
    const uint32_t ce = ob + static_cast<uint32_t>(end);
    if (normalize(chunk, norm)) {
      for (size_t k = 0; k < norm.size(); ++k) map.table.emplace_back(cb, ce);
    } else {
      for (size_t k = 0; k < chunk.size(); ++k) {
        map.table.emplace_back(cb + static_cast<uint32_t>(k), cb + static_cast<uint32_t>(k) + 1);
      }
    }
    start = end;
  }
}

std::pair<uint32_t, uint32_t> Tokenizer::Impl::to_input(const SegMap& map, int64_t nb, int64_t ne,
                                                        uint32_t lo, uint32_t hi) const {
  nb = std::clamp<int64_t>(nb, lo, hi);
  ne = std::clamp<int64_t>(ne, nb, hi);
  switch (map.kind) {
    case SegMap::Kind::kLinear:
      return {map.ob + static_cast<uint32_t>(nb), map.ob + static_cast<uint32_t>(ne)};
    case SegMap::Kind::kTable: {
      if (map.table.empty()) return {map.ob, map.ob};
      if (ne == nb) {
        const uint32_t p =
            nb < static_cast<int64_t>(map.table.size()) ? map.table[nb].first : map.oe;
        return {p, p};
      }
      return {map.table[nb].first, map.table[ne - 1].second};
    }
    case SegMap::Kind::kCoarse:
      return {map.ob, map.oe};
  }
  return {map.ob, map.oe};
}

void Tokenizer::Impl::find_added(
    const TokenTrie& trie, std::string_view s, const std::function<void(size_t, size_t)>& on_text,
    const std::function<void(int32_t, size_t, size_t)>& on_token) const {
  size_t start_offset = 0;
  size_t pos = 0;
  size_t b, e;
  int32_t t;
  auto ends_with_word = [&](size_t end) {
    if (end == 0) return false;
    size_t i = unicode::previous_code_point_start(s, end);
    return unicode::is_word_char(unicode::next_code_point(s, i));
  };
  auto starts_with_word = [&](size_t begin) {
    if (begin >= s.size()) return false;
    size_t i = begin;
    return unicode::is_word_char(unicode::next_code_point(s, i));
  };
  while (pos < s.size() && trie.find(s, pos, b, e, t)) {
    pos = e;
    const AddedToken& tok = added[t];
    if (tok.single_word && (ends_with_word(b) || starts_with_word(e))) continue;
    if (tok.lstrip) {
      size_t nb = b;
      while (nb > 0) {
        const size_t p = unicode::previous_code_point_start(s, nb);
        size_t q = p;
        if (!unicode::is_white_space(unicode::next_code_point(s, q))) break;
        nb = p;
      }
      b = std::max(nb, start_offset);
    }
    if (tok.rstrip) {
      while (e < s.size()) {
        size_t q = e;
        if (!unicode::is_white_space(unicode::next_code_point(s, q))) break;
        e = q;
      }
      pos = e;
    }
    if (start_offset < b) on_text(start_offset, b);
    on_token(tok.id, b, e);
    start_offset = e;
  }
  if (start_offset < s.size()) on_text(start_offset, s.size());
}

void Tokenizer::Impl::emit_word(const Piece& piece, const SegMap* map, Output out,
                                Work& work) const {
  if (!out.offsets) {
    bpe->encode_word(piece.text, *out.ids, nullptr);
    return;
  }
  work.lengths.clear();
  const size_t first = out.ids->size();
  bpe->encode_word(piece.text, *out.ids, &work.lengths);
  int64_t pos = piece.norm_base;
  for (size_t k = 0; k < out.ids->size() - first; ++k) {
    const int64_t next = pos + work.lengths[k];
    out.offsets->push_back(to_input(*map, pos, next, piece.nb, piece.ne));
    pos = next;
  }
}

void Tokenizer::Impl::run_pretokenizers(size_t step, const Piece& piece, const SegMap* map,
                                        Output out, Work& work) const {
  if (piece.text.empty()) return;
  if (step == pretokenizers.size()) {
    emit_word(piece, map, out, work);
    return;
  }
  const PreTokStep& s = pretokenizers[step];
  auto sub = [&](size_t b, size_t e) {
    if (e <= b) return;
    Piece p{piece.text.substr(b, e - b), piece.norm_base + static_cast<int64_t>(b), piece.nb,
            piece.ne};
    run_pretokenizers(step + 1, p, map, out, work);
  };
  if (s.kind == PreTokStep::Kind::kByteLevel) {
    Piece p = piece;
    if (s.add_prefix_space && p.text[0] != ' ') {
      std::string& owned = work.arena.emplace_back();
      owned.reserve(p.text.size() + 1);
      owned.push_back(' ');
      owned.append(p.text);
      p.text = owned;
      p.norm_base -= 1;
    }
    if (!s.regex) {
      run_pretokenizers(step + 1, p, map, out, work);
      return;
    }
    size_t prev = 0;
    s.regex->for_each_match(p.text, [&](size_t b, size_t e) {
      if (prev < b) {
        Piece g{p.text.substr(prev, b - prev), p.norm_base + static_cast<int64_t>(prev), p.nb,
                p.ne};
        run_pretokenizers(step + 1, g, map, out, work);
      }
      Piece m{p.text.substr(b, e - b), p.norm_base + static_cast<int64_t>(b), p.nb, p.ne};
      run_pretokenizers(step + 1, m, map, out, work);
      prev = e;
    });
    if (prev < p.text.size()) {
      Piece g{p.text.substr(prev), p.norm_base + static_cast<int64_t>(prev), p.nb, p.ne};
      run_pretokenizers(step + 1, g, map, out, work);
    }
    return;
  }
  // Split / Digits: (begin, end, is_match) covering the piece, then the behavior.
  if (s.kind == PreTokStep::Kind::kSplit && s.behavior == SplitBehavior::kIsolated) {
    // Fast path: isolated matches and gaps are pieces in order, whatever invert says.
    size_t prev = 0;
    s.regex->for_each_match(piece.text, [&](size_t b, size_t e) {
      sub(prev, b);
      sub(b, e);
      prev = e;
    });
    sub(prev, piece.text.size());
    return;
  }
  std::vector<std::tuple<size_t, size_t, bool>> marks;
  if (s.kind == PreTokStep::Kind::kSplit) {
    size_t prev = 0;
    s.regex->for_each_match(piece.text, [&](size_t b, size_t e) {
      if (prev < b) marks.emplace_back(prev, b, false);
      marks.emplace_back(b, e, true);
      prev = e;
    });
    if (prev < piece.text.size()) marks.emplace_back(prev, piece.text.size(), false);
    if (s.invert) {
      for (auto& m : marks) std::get<2>(m) = !std::get<2>(m);
    }
  } else {
    // Digits: every numeric character is a match of its own (tokenizers' char pattern).
    size_t i = 0, last = 0;
    while (i < piece.text.size()) {
      const size_t c0 = i;
      if (unicode::is_numeric(unicode::next_code_point(piece.text, i))) {
        if (last < c0) marks.emplace_back(last, c0, false);
        marks.emplace_back(c0, i, true);
        last = i;
      }
    }
    if (last < piece.text.size()) marks.emplace_back(last, piece.text.size(), false);
  }
  const SplitBehavior behavior =
      s.kind == PreTokStep::Kind::kDigits
          ? (s.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous)
          : s.behavior;
  std::vector<std::pair<size_t, size_t>> spans;
  spans.reserve(marks.size());
  // Spans in order, each mark joining the span before it when joins(match, previous match).
  auto join_forward = [&](auto joins) {
    bool prev_match = false;
    for (const auto& [b, e, m] : marks) {
      if (joins(m, prev_match) && !spans.empty()) {
        spans.back().second = e;
      } else {
        spans.emplace_back(b, e);
      }
      prev_match = m;
    }
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [b, e, m] : marks) spans.emplace_back(b, e);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& [b, e, m] : marks) {
        if (!m) spans.emplace_back(b, e);
      }
      break;
    case SplitBehavior::kContiguous:
      join_forward([](bool m, bool prev_match) { return m == prev_match; });
      break;
    case SplitBehavior::kMergedWithPrevious:
      join_forward([](bool m, bool prev_match) { return m && !prev_match; });
      break;
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (auto it = marks.rbegin(); it != marks.rend(); ++it) {
        const auto& [b, e, m] = *it;
        if (m && !prev_match && !spans.empty()) {
          spans.back().first = b;
        } else {
          spans.emplace_back(b, e);
        }
        prev_match = m;
      }
      std::reverse(spans.begin(), spans.end());
      break;
    }
  }
  for (const auto& [b, e] : spans) sub(b, e);
}

void Tokenizer::Impl::encode_segment(std::string_view text, uint32_t ob, Output out,
                                     Work& work) const {
  // text is a part of the input between added tokens, starting at input offset ob.
  std::string& norm = work.arena.emplace_back();
  const bool changed = !normalizers.empty() && normalize(text, norm);
  const std::string_view ntext = changed ? std::string_view(norm) : text;
  SegMap* map = nullptr;
  SegMap local;
  if (out.offsets) {
    local.ob = ob;
    local.oe = ob + static_cast<uint32_t>(text.size());
    if (changed) build_table(text, ob, local);
    map = &local;
  }
  auto run = [&](size_t b, size_t e) {
    Piece p{ntext.substr(b, e - b), static_cast<int64_t>(b), static_cast<uint32_t>(b),
            static_cast<uint32_t>(e)};
    run_pretokenizers(0, p, map, out, work);
  };
  if (normalized_trie.empty()) {
    run(0, ntext.size());
    return;
  }
  find_added(normalized_trie, ntext, run, [&](int32_t id, size_t b, size_t e) {
    out.ids->push_back(id);
    if (out.offsets) {
      out.offsets->push_back(to_input(*map, static_cast<int64_t>(b), static_cast<int64_t>(e), 0,
                                      static_cast<uint32_t>(ntext.size())));
    }
  });
}

void Tokenizer::Impl::encode(std::string_view text, bool add_special, Output out) const {
  const size_t bad = unicode::find_invalid(text);
  if (bad != std::string_view::npos) {
    LT_THROW(ErrorKind::kInput, "tokenizer input is not valid UTF-8 at byte ", bad);
  }
  LT_CHECK_INPUT(text.size() < (1ULL << 32) - 1, "tokenizer input of ", text.size(),
                 " bytes is too long (limit 4 GiB)");
  thread_local Work work;
  work.arena.clear();
  std::vector<int32_t> body_ids;
  std::vector<std::pair<uint32_t, uint32_t>> body_offsets;
  const bool wrap = add_special && has_template;
  Output body{wrap ? &body_ids : out.ids,
              out.offsets ? (wrap ? &body_offsets : out.offsets) : nullptr};
  if (raw_trie.empty()) {
    encode_segment(text, 0, body, work);
  } else {
    find_added(
        raw_trie, text,
        [&](size_t b, size_t e) {
          encode_segment(text.substr(b, e - b), static_cast<uint32_t>(b), body, work);
        },
        [&](int32_t id, size_t b, size_t e) {
          body.ids->push_back(id);
          if (body.offsets) {
            body.offsets->emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e));
          }
        });
  }
  if (!wrap) return;
  for (const TemplateItem& item : template_single) {
    if (item.is_sequence) {
      out.ids->insert(out.ids->end(), body_ids.begin(), body_ids.end());
      if (out.offsets) {
        out.offsets->insert(out.offsets->end(), body_offsets.begin(), body_offsets.end());
      }
    } else {
      for (int32_t id : item.special_ids) {
        out.ids->push_back(id);
        if (out.offsets) out.offsets->emplace_back(0, 0);
      }
    }
  }
}

}  // namespace leantune
