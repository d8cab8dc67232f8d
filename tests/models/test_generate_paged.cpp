// The paged generation engine (models/kv_cache.h, models/generate.h): the pool's blocks and
// reference counts, its reservation formula against a brute-force count, sleep and wake through
// allocator stats, and the scheduler: prompts with repeated rows (prefix sharing), a pool that
// holds one generation at a time and one of a few (continuous batching, early stops from a wide
// eos set) all give, token for token, what each prompt gives alone with its sequence number.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "loaders/model_config.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "models/kv_cache.h"
#include "testing/testing.h"

namespace leantune {
namespace {

std::unique_ptr<DecoderModel> tiny_model() {
  ModelConfig cfg = ModelConfig::load(testing::fixture_path("models/llama_gqa/model"));
  auto m = std::make_unique<DecoderModel>(cfg, Device::cpu(), DType::kF32);
  m->init_random(5);
  return m;
}

int64_t kv_tag_bytes() { return allocator(Device::cpu()).stats().tag(MemTag::kKVCache).current; }

TEST(PagedKVCache, BlocksRefcountsCopyAndSleep) {
  const auto m = tiny_model();
  const ModelConfig& c = m->config();
  const int64_t before = kv_tag_bytes();
  PagedKVCache pool(c, m->num_layers(), DType::kF32, Device::cpu(), 4, 6);
  const int64_t width = c.num_key_value_heads * c.head_dim;
  EXPECT_EQ(pool.bytes(), 2 * m->num_layers() * 6 * 4 * width * 4);
  EXPECT_EQ(kv_tag_bytes() - before, pool.bytes());
  EXPECT_EQ(pool.k(0).size(0), 24);
  const int32_t a = pool.allocate(), b = pool.allocate();
  EXPECT_EQ(pool.free_blocks(), 4);
  pool.retain(a);
  EXPECT_EQ(pool.refcount(a), 2);
  // copy_block moves the first rows of every layer's K and V.
  pool.k(1).narrow(0, a * 4, 4).copy_(testing::randn({4, width}, DType::kF32, 61));
  pool.v(0).narrow(0, a * 4, 4).copy_(testing::randn({4, width}, DType::kF32, 62));
  pool.copy_block(b, a, 3);
  EXPECT_EQ(pool.k(1).narrow(0, b * 4, 3).to_f64(), pool.k(1).narrow(0, a * 4, 3).to_f64());
  EXPECT_EQ(pool.v(0).narrow(0, b * 4, 3).to_f64(), pool.v(0).narrow(0, a * 4, 3).to_f64());
  EXPECT_THROW(pool.sleep(), Error);  // blocks in use
  pool.release(a);
  pool.release(a);
  pool.release(b);
  EXPECT_THROW(pool.release(b), Error);
  EXPECT_EQ(pool.free_blocks(), 6);
  EXPECT_EQ(pool.peak_blocks_used(), 2);
  pool.sleep();
  EXPECT_TRUE(pool.asleep());
  EXPECT_EQ(kv_tag_bytes(), before);
  EXPECT_THROW(pool.k(0), Error);
  pool.wake();
  EXPECT_EQ(kv_tag_bytes() - before, pool.bytes());
  for (int i = 0; i < 6; ++i) pool.allocate();
  EXPECT_THROW(pool.allocate(), Error);
}

// The blocks one prompt's generations touch, counted position by position: the prompt's blocks,
// and per generation every block holding a fed completion position (a private copy of the
// prompt's partial last block included).
int64_t brute_force_blocks(int64_t p, int64_t n, int64_t m, int64_t bs) {
  std::set<int64_t> shared;
  for (int64_t i = 0; i < p; ++i) shared.insert(i / bs);
  std::set<int64_t> own;
  for (int64_t i = p; i < p + m - 1; ++i) own.insert(i / bs);
  return static_cast<int64_t>(shared.size()) + n * static_cast<int64_t>(own.size());
}

TEST(PagedKVCache, ReservationCountsEveryBlockTouched) {
  for (int64_t bs : {1, 3, 16})
    for (int64_t p = 1; p <= 40; ++p)
      for (int64_t m = 0; m <= 40; ++m)
        for (int64_t n : {0, 1, 5})
          ASSERT_EQ(kv_blocks_for_prompt(p, n, m, bs), brute_force_blocks(p, n, m, bs))
              << "p " << p << " m " << m << " n " << n << " bs " << bs;
}

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  GenerationConfig cfg;
};

// Three prompts repeated four times each (interleaved with two single ones), lengths 1, 5, 9, 13
// and 19, sampled with a wide eos set so that generations stop at different steps.
Workload workload(int64_t vocab) {
  Workload w;
  const std::vector<int64_t> lengths = {9, 1, 13, 5, 19};
  std::vector<std::vector<int32_t>> distinct;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> p;
    for (int64_t j = 0; j < lengths[i]; ++j)
      p.push_back(static_cast<int32_t>((7 * j + 13 * i + 3) % vocab));
    distinct.push_back(p);
  }
  for (int rep = 0; rep < 4; ++rep)
    for (size_t i = 0; i < 3; ++i) w.prompts.push_back(distinct[i]);
  w.prompts.insert(w.prompts.begin() + 5, distinct[3]);
  w.prompts.push_back(distinct[4]);
  w.cfg.max_new_tokens = 12;
  w.cfg.temperature = 1.0;
  w.cfg.top_k = 40;
  w.cfg.seed = 99;
  w.cfg.first_sequence = 3;
  for (int32_t t = 10; t < vocab; t += 23) w.cfg.eos_token_ids.push_back(t);
  return w;
}

GenerationResult one_at_a_time(const DecoderModel& m, const Workload& w) {
  GenerationResult all;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    GenerationConfig g = w.cfg;
    g.first_sequence = w.cfg.first_sequence + static_cast<int64_t>(i);
    const GenerationResult r = generate(m, {w.prompts[i]}, g);
    all.tokens.push_back(r.tokens[0]);
    all.finished_by_eos.push_back(r.finished_by_eos[0]);
  }
  return all;
}

TEST(GeneratePaged, SharedPrefixesAndAnyPoolSizeGiveTheTokensOfOnePromptAlone) {
  const auto m = tiny_model();
  const Workload w = workload(m->config().vocab_size);
  const GenerationResult want = one_at_a_time(*m, w);
  int64_t stopped_early = 0;
  for (size_t i = 0; i < want.tokens.size(); ++i)
    stopped_early += want.finished_by_eos[i] && want.tokens[i].size() < 12;
  EXPECT_GE(stopped_early, 3) << "the workload should stop some generations early";

  const ModelConfig& c = m->config();
  // The whole call at once (the pool generate() sizes itself), and pools of block size 4 that
  // hold all, a few, or exactly one generation (of the longest prompt) at a time.
  const int64_t bs = 4, all = kv_blocks_for_call(w.prompts, 12, bs);
  const int64_t one = kv_blocks_for_prompt(19, 1, 12, bs);
  for (int64_t blocks : {int64_t{0}, all, one + 6, one}) {
    SCOPED_TRACE("blocks " + std::to_string(blocks));
    std::unique_ptr<PagedKVCache> pool;
    if (blocks > 0)
      pool = std::make_unique<PagedKVCache>(c, m->num_layers(), DType::kF32, Device::cpu(), bs,
                                            blocks);
    const GenerationResult got = generate(*m, w.prompts, w.cfg, pool.get());
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.finished_by_eos, want.finished_by_eos);
    if (pool) {
      EXPECT_EQ(pool->free_blocks(), blocks);
      EXPECT_LE(pool->peak_blocks_used(), blocks);
    }
  }
  // Prefix sharing: with every generation at once, the blocks in use peak below what separate
  // copies of each prompt would take.
  PagedKVCache pool(c, m->num_layers(), DType::kF32, Device::cpu(), bs, all);
  generate(*m, w.prompts, w.cfg, &pool);
  int64_t unshared = 0;
  for (const auto& p : w.prompts)
    unshared += kv_blocks_for_prompt(static_cast<int64_t>(p.size()), 1, 12, bs);
  EXPECT_LT(pool.peak_blocks_used(), unshared - 8);
  // The pool is reused by a second call and gives the same tokens again.
  EXPECT_EQ(generate(*m, w.prompts, w.cfg, &pool).tokens, want.tokens);
}

TEST(GeneratePaged, GreedyBatchEqualsOneAtATimeAndTooSmallAPoolIsNamed) {
  const auto m = tiny_model();
  Workload w = workload(m->config().vocab_size);
  w.cfg.temperature = 0;
  w.cfg.eos_token_ids = {2};
  const GenerationResult want = one_at_a_time(*m, w);
  EXPECT_EQ(generate(*m, w.prompts, w.cfg).tokens, want.tokens);
  PagedKVCache small(m->config(), m->num_layers(), DType::kF32, Device::cpu(), 4,
                     kv_blocks_for_prompt(19, 1, 12, 4) - 1);
  try {
    generate(*m, w.prompts, w.cfg, &small);
    FAIL() << "a pool too small for one generation was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("cannot hold one completion of a 19-token prompt"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace leantune
