// Flat varlen collation (see collate.h for the layout rules).
#include "loaders/collate.h"

#include <algorithm>
#include <cstdio>

#include "engine/check.h"
#include "loaders/host_batch.h"

namespace leantune {

namespace {

int64_t round_up(int64_t n, int64_t m) { return m > 0 ? (n + m - 1) / m * m : n; }

struct FlatBuilder {
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu{0};
  int64_t max_seqlen = 0;
  BatchStats stats;

  void reserve(int64_t t) {
    ids.reserve(static_cast<size_t>(t));
    pos.reserve(static_cast<size_t>(t));
    labels.reserve(static_cast<size_t>(t));
  }
  void close_sequence() {
    const int64_t len = static_cast<int64_t>(ids.size()) - cu.back();
    LT_CHECK(static_cast<int64_t>(ids.size()) <= INT32_MAX, "batch of ", ids.size(),
             " tokens exceeds int32 cu_seqlens");
    cu.push_back(static_cast<int32_t>(ids.size()));
    max_seqlen = std::max(max_seqlen, len);
  }
  Batch finish() { return host_batch(ids, pos, labels, cu, max_seqlen, stats); }
};

void check_row(const Row& r) {
  LT_CHECK(r.loss_mask.empty() || r.loss_mask.size() == r.input_ids.size(), "row mask size ",
           r.loss_mask.size(), " != ", r.input_ids.size());
  if (!r.seq_lengths.empty()) {
    int64_t sum = 0;
    for (int32_t l : r.seq_lengths) {
      LT_CHECK(l > 0, "row with an empty sequence");
      sum += l;
    }
    LT_CHECK(sum == static_cast<int64_t>(r.input_ids.size()), "seq_lengths sum ", sum,
             " != row length ", r.input_ids.size());
  }
}

Batch collate_padding_free(std::span<const Row> rows, const CollateOptions& opts) {
  FlatBuilder f;
  int64_t total = 0;
  for (const Row& r : rows) total += static_cast<int64_t>(r.input_ids.size());
  const int64_t padded = round_up(total, opts.pad_to_multiple_of);
  f.reserve(padded);
  for (const Row& r : rows) {
    check_row(r);
    const int64_t n = static_cast<int64_t>(r.input_ids.size());
    if (n == 0) continue;
    std::vector<int32_t> one;
    const std::vector<int32_t>* lens = &r.seq_lengths;
    if (lens->empty()) {
      one.push_back(static_cast<int32_t>(n));
      lens = &one;
    }
    int64_t at = 0;
    for (int32_t len : *lens) {
      for (int64_t p = 0; p < len; ++p, ++at) {
        const int64_t id = r.input_ids[static_cast<size_t>(at)];
        const bool keep = p > 0 && (r.loss_mask.empty() || r.loss_mask[static_cast<size_t>(at)]);
        f.ids.push_back(id);
        f.pos.push_back(p);
        f.labels.push_back(keep ? id : -100);
        f.stats.label_tokens += keep;
      }
      f.close_sequence();
      ++f.stats.sequences;
    }
  }
  f.stats.real_tokens = total;
  if (padded > total) {
    for (int64_t i = total; i < padded; ++i) {
      f.ids.push_back(opts.pad_token_id);
      f.pos.push_back(0);
      f.labels.push_back(-100);
    }
    f.close_sequence();
    f.stats.pad_tokens = padded - total;
  }
  return f.finish();
}

Batch collate_padded(std::span<const Row> rows, const CollateOptions& opts) {
  FlatBuilder f;
  int64_t longest = 0;
  for (const Row& r : rows) longest = std::max<int64_t>(longest, r.input_ids.size());
  const int64_t width = round_up(longest, opts.pad_to_multiple_of);
  f.reserve(width * static_cast<int64_t>(rows.size()));
  for (const Row& r : rows) {
    check_row(r);
    const int64_t n = static_cast<int64_t>(r.input_ids.size());
    for (int64_t p = 0; p < width; ++p) {
      if (p < n) {
        const int64_t id = r.input_ids[static_cast<size_t>(p)];
        const bool keep = r.loss_mask.empty() || r.loss_mask[static_cast<size_t>(p)];
        f.ids.push_back(id);
        f.labels.push_back(keep ? id : -100);
        f.stats.label_tokens += keep && p > 0;
      } else {
        f.ids.push_back(opts.pad_token_id);
        f.labels.push_back(-100);
      }
      f.pos.push_back(p);
    }
    f.close_sequence();
    ++f.stats.sequences;
    f.stats.real_tokens += n;
    f.stats.pad_tokens += width - n;
  }
  return f.finish();
}

}  // namespace

Batch collate(std::span<const Row> rows, const CollateOptions& opts) {
  LT_CHECK(opts.pad_to_multiple_of >= 0, "pad_to_multiple_of < 0");
  return opts.padding_free ? collate_padding_free(rows, opts) : collate_padded(rows, opts);
}

PreferenceBatch collate_preference(std::span<const PreferenceExample> pairs,
                                   const PreferenceCollateOptions& opts) {
  const size_t n = pairs.size();
  std::vector<Row> rows(2 * n);
  for (size_t k = 0; k < 2 * n; ++k) {
    const PreferenceExample& ex = pairs[k % n];
    const std::vector<int32_t>& completion = k < n ? ex.chosen_ids : ex.rejected_ids;
    build_preference_sequence(ex.prompt_ids, completion, opts.max_length, opts.truncation_mode,
                              &rows[k].input_ids, &rows[k].loss_mask);
  }
  CollateOptions c;
  c.padding_free = opts.padding_free;
  c.pad_to_multiple_of = opts.pad_to_multiple_of;
  c.pad_token_id = opts.pad_token_id;
  PreferenceBatch out;
  out.batch = collate(rows, c);
  out.pairs = static_cast<int64_t>(n);
  // The completion mask follows the same layout: rebuild it from the labels' row structure.
  const int64_t t = out.batch.num_tokens();
  std::vector<uint8_t> cm(static_cast<size_t>(t), 0);
  const std::vector<int64_t> cu = out.batch.cu_seqlens.to_i64();
  if (c.padding_free) {
    int64_t at = 0;
    for (const Row& r : rows) {
      for (uint8_t m : r.loss_mask) cm[static_cast<size_t>(at++)] = m;
    }
  } else {
    for (size_t k = 0; k < rows.size(); ++k) {
      for (size_t p = 0; p < rows[k].loss_mask.size(); ++p) {
        cm[static_cast<size_t>(cu[k]) + p] = rows[k].loss_mask[p];
      }
    }
  }
  out.completion_mask = Tensor::from_vector(cm, {t});
  return out;
}

BatchReport make_report(const Batch& batch, int64_t dropped_tokens) {
  BatchReport r;
  r.real_tokens = batch.stats.real_tokens;
  r.pad_tokens = batch.stats.pad_tokens;
  r.label_tokens = batch.stats.label_tokens;
  r.sequences = batch.stats.sequences;
  r.dropped_tokens = dropped_tokens;
  return r;
}

std::string BatchReport::str() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "tokens %lld (real %lld, pad %lld, dropped %lld), label tokens %lld, "
                "sequences %lld, efficiency %.4f",
                static_cast<long long>(real_tokens + pad_tokens),
                static_cast<long long>(real_tokens), static_cast<long long>(pad_tokens),
                static_cast<long long>(dropped_tokens), static_cast<long long>(label_tokens),
                static_cast<long long>(sequences), efficiency());
  return buf;
}

}  // namespace leantune
