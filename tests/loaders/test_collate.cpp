// Collation into flat varlen Batches: TRL acceptance cases 9-14 (trl_semantics.md §10), the
// padded / padding-free layouts with pad_to_multiple_of, loss masks and BatchStats.
#include <gtest/gtest.h>

#include "loaders/collate.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using V = std::vector<int64_t>;

V ids_of(const Batch& b) { return b.input_ids.to_i64(); }
V pos_of(const Batch& b) { return b.position_ids.to_i64(); }
V labels_of(const Batch& b) { return b.labels.to_i64(); }
V cu_of(const Batch& b) { return b.cu_seqlens.to_i64(); }

Row row(std::vector<int32_t> ids, std::vector<uint8_t> mask = {},
        std::vector<int32_t> seq_lengths = {}) {
  return Row{std::move(ids), std::move(mask), std::move(seq_lengths)};
}

TEST(CollateAcceptance, Case9PaddingFree) {
  const std::vector<Row> rows = {row({1, 2, 3}), row({4, 5})};
  const Batch b = collate(rows, {.padding_free = true, .pad_to_multiple_of = 0, .pad_token_id = 0});
  EXPECT_EQ(ids_of(b), (V{1, 2, 3, 4, 5}));
  EXPECT_EQ(pos_of(b), (V{0, 1, 2, 0, 1}));
  EXPECT_EQ(labels_of(b), (V{-100, 2, 3, -100, 5}));
  EXPECT_EQ(cu_of(b), (V{0, 3, 5}));
  EXPECT_EQ(b.max_seqlen, 3);
  EXPECT_EQ(b.input_ids.dtype(), DType::kI64);
  EXPECT_EQ(b.cu_seqlens.dtype(), DType::kI32);
}

TEST(CollateAcceptance, Case10PackedSeqLengths) {
  const std::vector<Row> rows = {row({1, 2, 3, 4, 5, 6}, {}, {3, 3}),
                                 row({7, 8, 9, 10, 11}, {}, {4, 1})};
  const Batch b = collate(rows, {.padding_free = true, .pad_to_multiple_of = 0, .pad_token_id = 0});
  EXPECT_EQ(pos_of(b), (V{0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(labels_of(b), (V{-100, 2, 3, -100, 5, 6, -100, 8, 9, 10, -100}));
  EXPECT_EQ(cu_of(b), (V{0, 3, 6, 10, 11}));
  EXPECT_EQ(b.max_seqlen, 4);
  EXPECT_EQ(b.stats.sequences, 4);
  EXPECT_EQ(b.stats.real_tokens, 11);
  EXPECT_EQ(b.stats.pad_tokens, 0);
  EXPECT_EQ(b.stats.label_tokens, 7);
}

TEST(CollateAcceptance, Case11PadToMultipleOfPadded) {
  const std::vector<Row> rows = {row({1, 2, 3}), row({4, 5})};
  const Batch b =
      collate(rows, {.padding_free = false, .pad_to_multiple_of = 4, .pad_token_id = 0});
  EXPECT_EQ(ids_of(b), (V{1, 2, 3, 0, 4, 5, 0, 0}));
  EXPECT_EQ(labels_of(b), (V{1, 2, 3, -100, 4, 5, -100, -100}));
  EXPECT_EQ(pos_of(b), (V{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(cu_of(b), (V{0, 4, 8}));
  EXPECT_EQ(b.max_seqlen, 4);
  EXPECT_EQ(b.stats.real_tokens, 5);
  EXPECT_EQ(b.stats.pad_tokens, 3);
  EXPECT_EQ(b.stats.sequences, 2);
  EXPECT_EQ(b.stats.label_tokens, 3);  // 2, 3 and 5: first positions never reach the loss
}

TEST(CollateAcceptance, Case11PadToMultipleOfPaddingFree) {
  const std::vector<Row> rows = {row({1, 2, 3}), row({4, 5})};
  const Batch b = collate(rows, {.padding_free = true, .pad_to_multiple_of = 4, .pad_token_id = 0});
  EXPECT_EQ(ids_of(b), (V{1, 2, 3, 4, 5, 0, 0, 0}));
  EXPECT_EQ(pos_of(b), (V{0, 1, 2, 0, 1, 0, 0, 0}));
  EXPECT_EQ(labels_of(b), (V{-100, 2, 3, -100, 5, -100, -100, -100}));
  // The padding is one trailing sequence: real sequences keep their ranges.
  EXPECT_EQ(cu_of(b), (V{0, 3, 5, 8}));
  EXPECT_EQ(b.stats.sequences, 2);
  EXPECT_EQ(b.stats.pad_tokens, 3);
  EXPECT_EQ(b.max_seqlen, 3);
}

TEST(CollateAcceptance, Case12AssistantMask) {
  const std::vector<Row> rows = {row({1, 2, 3, 4}, {0, 0, 1, 1})};
  const Batch b =
      collate(rows, {.padding_free = false, .pad_to_multiple_of = 0, .pad_token_id = 0});
  EXPECT_EQ(labels_of(b), (V{-100, -100, 3, 4}));
  const Batch f = collate(rows, {.padding_free = true, .pad_to_multiple_of = 0, .pad_token_id = 0});
  EXPECT_EQ(labels_of(f), (V{-100, -100, 3, 4}));
}

TEST(CollateAcceptance, Case13PreferenceCollator) {
  const std::vector<PreferenceExample> pairs = {{{1, 2, 3}, {4, 5}, {6}, 1},
                                                {{7, 8}, {9, 10}, {11, 12, 13}, 2}};
  const PreferenceBatch p =
      collate_preference(pairs, {.max_length = 0,
                                 .truncation_mode = TruncationMode::kKeepStart,
                                 .padding_free = false,
                                 .pad_to_multiple_of = 0,
                                 .pad_token_id = 0});
  EXPECT_EQ(p.pairs, 2);
  EXPECT_EQ(ids_of(p.batch), (V{1, 2, 3, 4, 5, 7, 8, 9, 10, 0, 1, 2, 3, 6, 0, 7, 8, 11, 12, 13}));
  const std::vector<uint8_t> cm = [&] {
    std::vector<uint8_t> v(20);
    std::memcpy(v.data(), p.completion_mask.data_ptr(), 20);
    return v;
  }();
  EXPECT_EQ(cm, (std::vector<uint8_t>{0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(labels_of(p.batch), (V{-100, -100, -100, 4, 5,    -100, -100, 9,  10, -100,
                                   -100, -100, -100, 6, -100, -100, -100, 11, 12, 13}));
  EXPECT_EQ(cu_of(p.batch), (V{0, 5, 10, 15, 20}));
}

TEST(CollateAcceptance, Case14PreferenceTruncation) {
  std::vector<int32_t> ids;
  std::vector<uint8_t> cm;
  const std::vector<int32_t> prompt = {1, 2, 3}, completion = {4, 5};
  build_preference_sequence(prompt, completion, 4, TruncationMode::kKeepStart, &ids, &cm);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(cm, (std::vector<uint8_t>{0, 0, 0, 1}));
  build_preference_sequence(prompt, completion, 4, TruncationMode::kKeepEnd, &ids, &cm);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3, 4, 5}));
  EXPECT_EQ(cm, (std::vector<uint8_t>{0, 0, 1, 1}));
  build_preference_sequence(prompt, completion, 0, TruncationMode::kKeepEnd, &ids, &cm);
  EXPECT_EQ(ids.size(), 5u);
}

TEST(Collate, PaddedIgnoresSeqLengthsAndMasksLabels) {
  const std::vector<Row> rows = {row({1, 2, 3, 4}, {1, 0, 1, 1}, {2, 2}), row({5})};
  const Batch b =
      collate(rows, {.padding_free = false, .pad_to_multiple_of = 0, .pad_token_id = 9});
  EXPECT_EQ(ids_of(b), (V{1, 2, 3, 4, 5, 9, 9, 9}));
  EXPECT_EQ(labels_of(b), (V{1, -100, 3, 4, 5, -100, -100, -100}));
  EXPECT_EQ(pos_of(b), (V{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(cu_of(b), (V{0, 4, 8}));
  EXPECT_EQ(b.stats.label_tokens, 2);
  EXPECT_EQ(b.stats.real_tokens, 5);
  EXPECT_EQ(b.stats.pad_tokens, 3);
}

TEST(Collate, PadToMultipleAlreadyAligned) {
  const std::vector<Row> rows = {row({1, 2}), row({3, 4})};
  const Batch f = collate(rows, {.padding_free = true, .pad_to_multiple_of = 4, .pad_token_id = 0});
  EXPECT_EQ(cu_of(f), (V{0, 2, 4}));  // no pad sequence when nothing is padded
  EXPECT_EQ(f.stats.pad_tokens, 0);
  const Batch p =
      collate(rows, {.padding_free = false, .pad_to_multiple_of = 2, .pad_token_id = 0});
  EXPECT_EQ(p.num_tokens(), 4);
}

TEST(Collate, EfficiencyReport) {
  const std::vector<Row> rows = {row({1, 2, 3}), row({4, 5})};
  const Batch b =
      collate(rows, {.padding_free = false, .pad_to_multiple_of = 4, .pad_token_id = 0});
  const BatchReport r = make_report(b, 7);
  EXPECT_EQ(r.real_tokens, 5);
  EXPECT_EQ(r.pad_tokens, 3);
  EXPECT_EQ(r.dropped_tokens, 7);
  EXPECT_DOUBLE_EQ(r.efficiency(), 5.0 / 8.0);
  EXPECT_NE(r.str().find("efficiency 0.6250"), std::string::npos) << r.str();
}

TEST(Collate, PreferencePaddingFree) {
  const std::vector<PreferenceExample> pairs = {{{1, 2}, {3}, {4, 5}, 1}};
  const PreferenceBatch p =
      collate_preference(pairs, {.max_length = 0,
                                 .truncation_mode = TruncationMode::kKeepStart,
                                 .padding_free = true,
                                 .pad_to_multiple_of = 0,
                                 .pad_token_id = 0});
  EXPECT_EQ(ids_of(p.batch), (V{1, 2, 3, 1, 2, 4, 5}));
  EXPECT_EQ(labels_of(p.batch), (V{-100, -100, 3, -100, -100, 4, 5}));
  EXPECT_EQ(cu_of(p.batch), (V{0, 3, 7}));
}

}  // namespace
}  // namespace leantune
