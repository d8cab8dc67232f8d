// ZeRO-3's parameter residency (dist/zero3.h) in one process (one rank owns every slice):
// the sharded weights' memory is given back between uses (allocator stats) and touching one then
// is an Error naming it; uses nest; a forward and backward under the residency give the plain
// model's loss and gradients exactly, with the layers gathered one at a time (plus the outer
// unit); acquire_all/reshard_from_full round-trip new values; a quantized (NF4) base is sharded
// and gathered like a frozen weight; prefetch follows the last pass's order. Multi-rank runs are in
// tests/dist/data_parallel.sh (z3_*, ga2_z3_*, resume_z3, ds3_generation).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dist/zero3.h"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/comm.h"
#include "engine/ops.h"
#include "loaders/model_config.h"
#include "models/decoder.h"
#include "models/quantize_model.h"
#include "models/quantized_linear.h"
#include "testing/testing.h"

namespace leantune {
namespace {

std::shared_ptr<DecoderModel> tiny(uint64_t seed = 3) {
  ModelConfig cfg = ModelConfig::load(testing::fixture_path("models/llama_gqa/model"));
  auto m = std::make_shared<DecoderModel>(cfg, Device::cpu(), DType::kF32);
  m->init_random(seed);
  m->set_requires_grad(true);
  return m;
}

Batch batch_of(int64_t vocab) {
  const std::vector<int64_t> lengths = {7, 12};
  std::vector<int64_t> ids, pos;
  std::vector<int32_t> cu{0};
  for (int64_t len : lengths) {
    for (int64_t j = 0; j < len; ++j) {
      ids.push_back((5 * j + 3 * len) % vocab);
      pos.push_back(j);
    }
    cu.push_back(static_cast<int32_t>(ids.size()));
  }
  Batch b;
  const int64_t t = static_cast<int64_t>(ids.size());
  b.input_ids = Tensor::from_vector(ids, {t});
  b.position_ids = Tensor::from_vector(pos, {t});
  b.labels = Tensor::from_vector(ids, {t});
  b.cu_seqlens = Tensor::from_vector(cu, {3});
  b.max_seqlen = 12;
  return b;
}

int64_t param_bytes() { return allocator(Device::cpu()).stats().tag(MemTag::kParam).current; }

TEST(Zero3Params, WeightsLiveOnlyWhileUsedAndGiveTheSameGradients) {
  auto comm = make_single_communicator();
  const auto plain = tiny(), sharded = tiny();
  const Batch b = batch_of(plain->config().vocab_size);
  ForwardOptions fo;
  ForwardResult want = plain->forward(b, fo);
  want.loss.backward();

  const int64_t before = param_bytes();
  int64_t layer_bytes = 0, total = 0;
  for (const auto& [name, t] : sharded->named_parameters()) {
    total += static_cast<int64_t>(t.nbytes());
    if (name.rfind("model.layers.0.", 0) == 0) layer_bytes += static_cast<int64_t>(t.nbytes());
  }
  {
    // Threshold 100: the norms (64 elements) stay whole, every matrix is sharded.
    Zero3Params z(*comm, *sharded, 100);
    const int64_t whole = z.persistent_bytes();
    EXPECT_GT(whole, 0);
    // One rank's slices are the whole sharded weights; the weights' own storage is gone.
    EXPECT_EQ(z.shard_bytes() + whole, total);
    EXPECT_EQ(param_bytes() - before, 0);
    const Tensor q = sharded->layer(0).q_proj.weight;
    try {
      q.to_f64();
      FAIL() << "a released weight was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ZeRO-3 parameter used outside its gathered unit"),
                std::string::npos)
          << e.what();
    }
    {
      ParamUse outer(&z, 0);
      ParamUse inner(&z, 0);  // uses nest
      EXPECT_EQ(z.gathered_bytes(), layer_bytes - 2 * 64 * 4);
      EXPECT_EQ(q.to_f64(), plain->layer(0).q_proj.weight.to_f64());
    }
    EXPECT_EQ(z.gathered_bytes(), 0);
    // Forward and backward under the residency, as the trainer runs a micro-batch.
    ForwardResult got;
    {
      SavedTensorHooksGuard hooks(z.saved_tensor_hooks());
      got = sharded->forward(b, fo);
      got.loss.backward();
      z.end_backward();
    }
    EXPECT_EQ(got.loss.item(), want.loss.item());
    EXPECT_EQ(z.gathered_bytes(), 0);
    // At most the outer unit and one layer at once (2 layers here: less than the whole model).
    EXPECT_LT(z.peak_gathered_bytes(), total - whole);
    const auto pn = plain->named_parameters(), sn = sharded->named_parameters();
    for (size_t i = 0; i < pn.size(); ++i)
      EXPECT_EQ(sn[i].second.grad().to_f64(), pn[i].second.grad().to_f64()) << pn[i].first;
    // New whole values (a loaded checkpoint) become the slices.
    z.acquire_all();
    ops::fill(sharded->layer(1).down_proj.weight.detach(), 0.25);
    z.reshard_from_full();
    z.release_all();
    ParamUse use(&z, 1);
    for (double x : sharded->layer(1).down_proj.weight.to_f64()) ASSERT_EQ(x, 0.25);
  }
}

// Prefetch: the first pass records the order of the gathers; the second, following it, has every
// gather but its first started ahead (and used), with the same loss and gradients; a pass that
// leaves the trace stops prefetching and drops nothing in flight past end_backward(). A bucket of
// 0 prefetches nothing.
TEST(Zero3Params, PrefetchFollowsTheLastPassAndChangesNothing) {
  auto comm = make_single_communicator();
  const auto sharded = tiny(), unprefetched = tiny();
  const Batch b = batch_of(sharded->config().vocab_size);
  ForwardOptions fo;
  auto pass = [&](DecoderModel& m, Zero3Params& z) {
    for (auto [name, t] : m.named_parameters()) t.zero_grad();
    SavedTensorHooksGuard hooks(z.saved_tensor_hooks());
    ForwardResult r = m.forward(b, fo);
    r.loss.backward();
    z.end_backward();
    return r.loss.item();
  };
  // One residency at a time: each observes every backward.
  double want = 0;
  {
    Zero3Params none(*comm, *unprefetched, 100, 0);
    want = pass(*unprefetched, none);
    EXPECT_EQ(pass(*unprefetched, none), want);
    EXPECT_EQ(none.prefetch_hits(), 0);
  }
  Zero3Params z(*comm, *sharded, 100, 1'000'000);
  EXPECT_EQ(pass(*sharded, z), want);
  EXPECT_EQ(z.prefetch_hits(), 0);  // no trace yet
  EXPECT_EQ(pass(*sharded, z), want);
  EXPECT_GT(z.prefetch_hits(), 0);
  EXPECT_EQ(z.prefetch_unused(), 0);
  const auto sn = sharded->named_parameters(), un = unprefetched->named_parameters();
  for (size_t i = 0; i < sn.size(); ++i)
    EXPECT_EQ(sn[i].second.grad().to_f64(), un[i].second.grad().to_f64()) << sn[i].first;
  // A pass that uses layer 1 first leaves the trace at once: nothing more is prefetched, and
  // nothing is left in flight or gathered after the pass.
  const int64_t hits = z.prefetch_hits();
  { ParamUse use(&z, 1); }
  z.end_backward();
  EXPECT_EQ(z.prefetch_hits(), hits);
  EXPECT_EQ(z.gathered_bytes(), 0);
  // The next pass is measured against that lone use: it leaves the trace too, and is right.
  EXPECT_EQ(pass(*sharded, z), want);
  EXPECT_EQ(z.prefetch_hits(), hits);
}

// QLoRA under stage 3: a quantized base's parts (packed NF4 codes and quant state) are frozen
// groups like any other; released between uses, gathered for the layer's forward and backward,
// and the loss and gradients are the plain quantized model's exactly.
TEST(Zero3Params, QuantizedBaseIsShardedLikeAFrozenWeight) {
  auto comm = make_single_communicator();
  QuantConfig qc;
  qc.load_in_4bit = true;
  qc.compute_dtype = DType::kF32;
  const auto plain = tiny(), sharded = tiny();
  quantize_model(*plain, qc);
  quantize_model(*sharded, qc);
  const Batch b = batch_of(plain->config().vocab_size);
  ForwardResult want = plain->forward(b, {});
  want.loss.backward();
  const auto* q = dynamic_cast<const Nf4Linear*>(sharded->layer(0).q_proj.base.get());
  ASSERT_NE(q, nullptr);
  const Tensor packed = q->weight().packed;
  Zero3Params z(*comm, *sharded, 100);
  int u8_groups = 0;
  for (const Zero3Params::Group& g : z.groups())
    if (g.dtype == DType::kU8) {
      EXPECT_FALSE(g.trainable);
      ++u8_groups;
    }
  EXPECT_EQ(u8_groups, 2);  // one u8 group per decoder layer (codes and quantized absmax)
  EXPECT_THROW(packed.to_f64(), Error);
  {
    ParamUse use(&z, 0);
    const auto* p = dynamic_cast<const Nf4Linear*>(plain->layer(0).q_proj.base.get());
    EXPECT_EQ(packed.to_f64(), p->weight().packed.to_f64());
  }
  ForwardResult got;
  {
    SavedTensorHooksGuard hooks(z.saved_tensor_hooks());
    got = sharded->forward(b, {});
    got.loss.backward();
    z.end_backward();
  }
  EXPECT_EQ(got.loss.item(), want.loss.item());
  EXPECT_EQ(z.gathered_bytes(), 0);
  const auto pn = plain->named_parameters(), sn = sharded->named_parameters();
  for (size_t i = 0; i < pn.size(); ++i)
    EXPECT_EQ(sn[i].second.grad().to_f64(), pn[i].second.grad().to_f64()) << pn[i].first;
}

}  // namespace
}  // namespace leantune
