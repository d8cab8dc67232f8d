#include <gtest/gtest.h>

#include "engine/autograd.h"
#include "testing/functional.h"
#include "testing/gradcheck.h"
#include "testing/testing.h"

namespace leantune {
namespace {

using testing::gradcheck;
using testing::randn;

Tensor f64(const Shape& s, uint64_t seed) { return randn(s, DType::kF64, seed); }

TEST(Autograd, GradcheckElementwiseComposite) {
  // f(a, b) = sum(exp(tanh(a) * b) + log_sigmoid(a - b)) / 3
  auto f = [](const std::vector<Tensor>& in) {
    Tensor t =
        fn::add(fn::exp(fn::mul(fn::tanh(in[0]), in[1])), fn::log_sigmoid(fn::sub(in[0], in[1])));
    return std::vector<Tensor>{fn::scale(fn::sum(t), 1.0 / 3.0)};
  };
  EXPECT_TRUE(gradcheck(f, {f64({3, 5}, 1), f64({3, 5}, 2)}));
}

TEST(Autograd, GradcheckMatmulAllTransposes) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor a = ta ? f64({4, 3}, 3) : f64({3, 4}, 3);
      Tensor b = tb ? f64({5, 4}, 4) : f64({4, 5}, 4);
      auto f = [ta, tb](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{fn::matmul(in[0], in[1], ta, tb)};
      };
      EXPECT_TRUE(gradcheck(f, {a, b})) << "ta=" << ta << " tb=" << tb;
    }
  }
}

TEST(Autograd, GradcheckBroadcastAndReductions) {
  // Row broadcast (bias), scalar broadcast, softmax, log_softmax, div, sum_dim, mean.
  auto f = [](const std::vector<Tensor>& in) {
    Tensor y = fn::add(in[0], in[1]);                // [4,6] + [6]
    Tensor z = fn::mul(fn::softmax_last(y), in[2]);  // * scalar
    Tensor w = fn::div(fn::log_softmax_last(in[0]), fn::add_scalar(fn::square(in[1]), 1.0));
    return std::vector<Tensor>{fn::sum_dim(z, 0), fn::mean(w), fn::sum_dim(y, 1, true)};
  };
  EXPECT_TRUE(gradcheck(f, {f64({4, 6}, 5), f64({6}, 6), f64({1}, 7)}));
}

TEST(Autograd, GradcheckViewsAndCat) {
  auto f = [](const std::vector<Tensor>& in) {
    Tensor x = in[0];                              // [4, 6]
    Tensor a = x.narrow(1, 1, 3);                  // strided view
    Tensor b = x.reshape({6, 4}).transpose(0, 1);  // [4, 6] non-contiguous
    Tensor c = fn::cat0({a.contiguous(), x.select(0, 2).reshape({2, 3})});
    return std::vector<Tensor>{fn::mul(b, x), c, fn::relu(fn::clamp(x, -0.5, 0.7))};
  };
  EXPECT_TRUE(gradcheck(f, {f64({4, 6}, 8)}));
}

TEST(Autograd, GradcheckMinimumMaximum) {
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{fn::minimum(in[0], in[1]), fn::maximum(in[0], fn::sigmoid(in[1]))};
  };
  EXPECT_TRUE(gradcheck(f, {f64({7}, 9), f64({7}, 10)}));
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCallsAndUses) {
  Tensor x = Tensor::from_vector<double>({1.0, 2.0, 3.0}, {3});
  x.set_requires_grad(true);
  // x used twice: d/dx sum(x*x + 3x) = 2x + 3
  Tensor y = fn::sum(fn::add(fn::mul(x, x), fn::scale(x, 3.0)));
  y.backward();
  EXPECT_EQ(x.grad().to_f64(), (std::vector<double>{5.0, 7.0, 9.0}));
  EXPECT_EQ(x.grad().tag(), MemTag::kGrad);
  Tensor y2 = fn::sum(x);
  y2.backward();
  EXPECT_EQ(x.grad().to_f64(), (std::vector<double>{6.0, 8.0, 10.0}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, NoGradAndDetachStopGradients) {
  Tensor x = Tensor::from_vector<double>({1.0, 2.0}, {2});
  x.set_requires_grad(true);
  {
    NoGradGuard ng;
    Tensor y = fn::mul(x, x);
    EXPECT_FALSE(y.requires_grad());
  }
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.shares_storage(x));
  Tensor y = fn::sum(fn::mul(x, d));  // gradient only through the first factor
  y.backward();
  EXPECT_EQ(x.grad().to_f64(), (std::vector<double>{1.0, 2.0}));
}

TEST(Autograd, SavedTensorsAreReleasedAfterBackward) {
  Tensor x = f64({64, 64}, 11);
  x.set_requires_grad(true);
  Tensor y = fn::sum(fn::exp(x));
  y.backward();
  EXPECT_THROW(y.backward(), Error);  // graph freed: a second backward is an error
}

TEST(Autograd, BackwardOnTensorWithoutGradIsAnError) {
  Tensor x = f64({2}, 1);
  EXPECT_THROW(fn::sum(x).backward(), Error);
}

// A hook that counts calls and keeps packed tensors in its own list, proving that unpack is
// what backward uses.
class RecordingHooks final : public SavedTensorHooks {
 public:
  std::shared_ptr<void> pack(const Tensor& t) override {
    ++packs;
    Tensor copy = t.clone(MemTag::kOther);  // a different buffer than the original
    stored.push_back(copy);
    return std::make_shared<size_t>(stored.size() - 1);
  }
  Tensor unpack(const std::shared_ptr<void>& h) override {
    ++unpacks;
    return stored[*static_cast<size_t*>(h.get())];
  }
  int packs = 0;
  int unpacks = 0;
  std::vector<Tensor> stored;
};

TEST(Autograd, SavedTensorHooksArePackedAndUnpackedAndHonoured) {
  auto hooks = std::make_shared<RecordingHooks>();
  Tensor x = Tensor::from_vector<double>({1.0, 2.0}, {2});
  x.set_requires_grad(true);
  Tensor y;
  {
    SavedTensorHooksGuard g(hooks);
    y = fn::sum(fn::exp(x));  // exp saves its output
  }
  EXPECT_EQ(hooks->packs, 1);
  EXPECT_EQ(hooks->unpacks, 0);
  // Change what the hook will hand back: backward must use it.
  hooks->stored[0].fill_(10.0);
  y.backward();
  EXPECT_EQ(hooks->unpacks, 1);
  EXPECT_EQ(x.grad().to_f64(), (std::vector<double>{10.0, 10.0}));
  EXPECT_EQ(current_saved_tensor_hooks(), nullptr);
}

TEST(Autograd, NodesRunInReverseCreationOrder) {
  std::vector<std::string> order;
  struct Obs : BackwardObserver {
    std::vector<std::string>* out;
    void before_node(Node& n) override { out->push_back(n.name()); }
  } obs;
  obs.out = &order;
  Tensor x = f64({3}, 2);
  x.set_requires_grad(true);
  Tensor y = fn::sum(fn::log_sigmoid(fn::exp(x)));
  add_backward_observer(&obs);
  y.backward();
  remove_backward_observer(&obs);
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order[0], "SumBackward");
  EXPECT_EQ(order[1], "LogSigmoidBackward");
  EXPECT_EQ(order[2], "ExpBackward");
  EXPECT_EQ(order[3], "AccumulateGrad");
}

// ------------------------------------------------------------------ checkpoint

// A small "layer stack": h -> tanh(h W_i) * sigmoid(h), repeated. Without checkpointing each
// layer keeps three [n, d] activations alive (tanh and sigmoid outputs, the layer output).
std::vector<Tensor> layer(const std::vector<Tensor>& in, const Tensor& w) {
  Tensor h = in[0];
  return {fn::mul(fn::tanh(fn::matmul(h, w)), fn::sigmoid(h))};
}

TEST(Checkpoint, SameGradientsWithFewerSavedBytes) {
  const int64_t n = 64, d = 128, layers = 4;
  auto run = [&](bool ckpt, std::vector<Tensor>& ws, Tensor& x, int64_t* held_saved) {
    Allocator& a = allocator(Device::cpu());
    const int64_t before = a.stats().tag(MemTag::kActivation).current;
    Tensor h = x;
    for (int64_t l = 0; l < layers; ++l) {
      Tensor w = ws[l];
      auto f = [w](const std::vector<Tensor>& in) { return layer(in, w); };
      h = ckpt ? checkpoint(f, {h})[0] : f({h})[0];
    }
    Tensor loss = fn::sum(h);
    *held_saved = a.stats().tag(MemTag::kActivation).current - before;
    loss.backward();
  };
  auto make = [&](std::vector<Tensor>& ws, Tensor& x) {
    ws.clear();
    for (int64_t l = 0; l < layers; ++l) {
      Tensor w = randn({d, d}, DType::kF32, 100 + l, Device::cpu(), 0.1);
      w.storage()->set_tag(MemTag::kParam);
      w.set_requires_grad(true);
      ws.push_back(w);
    }
    x = randn({n, d}, DType::kF32, 7);
    x.set_requires_grad(true);
  };
  std::vector<Tensor> w1, w2;
  Tensor x1, x2;
  make(w1, x1);
  make(w2, x2);
  int64_t held_plain = 0, held_ckpt = 0;
  run(false, w1, x1, &held_plain);
  run(true, w2, x2, &held_ckpt);
  for (int64_t l = 0; l < layers; ++l)
    EXPECT_TRUE(testing::all_close(w2[l].grad(), w1[l].grad(), 1e-6, 1e-5)) << "layer " << l;
  EXPECT_TRUE(testing::all_close(x2.grad(), x1.grad(), 1e-6, 1e-5));
  // Checkpointed: only each layer's output (the next layer's input) lives on.
  const int64_t per = n * d * 4;
  EXPECT_EQ(held_plain, 3 * layers * per);
  EXPECT_EQ(held_ckpt, layers * per);
}

TEST(Checkpoint, ParametersInsideGetGradientsWhenInputsDoNot) {
  Tensor w = randn({8, 8}, DType::kF64, 3);
  w.set_requires_grad(true);
  Tensor x = randn({4, 8}, DType::kF64, 4);  // frozen input (e.g. frozen embeddings + LoRA)
  auto f = [w](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn::matmul(in[0], w)}; };
  Tensor y = checkpoint(f, {x})[0];
  ASSERT_TRUE(y.requires_grad());
  fn::sum(y).backward();
  ASSERT_TRUE(w.grad().defined());
  // d sum(xW)/dW = x^T 1
  Tensor expect = ops::matmul(x, Tensor::full({4, 8}, 1.0, DType::kF64), true, false);
  EXPECT_TRUE(testing::all_close(w.grad(), expect, 1e-12, 1e-12));
}

TEST(Checkpoint, ReplaysRandomState) {
  Generator gen(5, RngPurpose::kDropout);
  GeneratorReplay replay(&gen);
  register_replayable_state(&replay);
  Tensor x = randn({16}, DType::kF64, 1);
  x.set_requires_grad(true);
  auto f = [&gen](const std::vector<Tensor>& in) {
    Tensor mask = Tensor::empty({16}, DType::kF64);
    bernoulli_(mask, gen, 0.5);
    return std::vector<Tensor>{fn::mul(in[0], mask)};
  };
  const uint64_t off0 = gen.offset();
  Tensor y = checkpoint(f, {x})[0];
  std::vector<double> yv = y.to_f64(), xv = x.to_f64();
  const uint64_t off1 = gen.offset();
  fn::sum(y).backward();
  EXPECT_EQ(gen.offset(), off1);  // recompute does not disturb the live stream
  EXPECT_NE(off0, off1);
  std::vector<double> g = x.grad().to_f64();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i] * xv[i], yv[i]) << i;  // same mask
}

}  // namespace
}  // namespace leantune
