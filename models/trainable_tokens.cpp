// Trainable tokens on the embedding (see trainable_tokens.h).
#include "models/trainable_tokens.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/embedding.h"
#include "models/decoder.h"

namespace leantune {

namespace {

Tensor i64_on(const std::vector<int64_t>& v, Device d) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, d, MemTag::kWorkspace);
}

// Copies delta rows into w at the listed indices, one copy per run of consecutive indices (new
// tokens usually sit together at the end of the vocabulary).
void write_rows(const Tensor& w, const Tensor& delta, const std::vector<int64_t>& indices) {
  std::vector<std::pair<int64_t, int64_t>> order;  // (index, delta row)
  for (size_t j = 0; j < indices.size(); ++j) order.emplace_back(indices[j], j);
  std::sort(order.begin(), order.end());
  for (size_t k = 0; k < order.size();) {
    size_t e = k + 1;
    while (e < order.size() && order[e].first == order[e - 1].first + 1 &&
           order[e].second == order[e - 1].second + 1)
      ++e;
    const int64_t len = static_cast<int64_t>(e - k);
    ops::copy(w.narrow(0, order[k].first, len), delta.narrow(0, order[k].second, len));
    k = e;
  }
}

// Embedding lookup where listed ids read their delta row. Backward: the gradient rows of those
// positions summed per delta row.
class TokensEmbedBackward final : public Node {
 public:
  Tensor positions;  // i64 [m]: positions whose id is listed
  Tensor rows;       // i64 [m]: their delta rows
  Shape delta_shape;

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& dy = grads[0];
    if (!dy.defined()) return {Tensor()};
    Tensor dd = Tensor::empty(delta_shape, dy.dtype(), dy.device());
    if (positions.numel() == 0) {
      dd.zero_();
    } else {
      kernels::embedding_bwd(ops::index_rows(dy, positions), rows, dd);
    }
    return {dd};
  }
  std::string name() const override { return "TrainableTokensEmbedBackward"; }
};

// embed_tokens with the listed rows replaced. Backward: the listed rows of the gradient.
class TokensMatrixBackward final : public Node {
 public:
  Tensor index;  // i64 [n]

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& dw = grads[0];
    if (!dw.defined()) return {Tensor()};
    return {ops::index_rows(dw, index)};
  }
  std::string name() const override { return "TrainableTokensMatrixBackward"; }
};

}  // namespace

TrainableTokens::TrainableTokens(const DecoderModel& model, std::vector<int64_t> indices)
    : indices_(std::move(indices)) {
  const int64_t vocab = model.config().vocab_size;
  LT_CHECK_INPUT(!indices_.empty(), "trainable_token_indices is empty");
  std::unordered_set<int64_t> seen;
  for (int64_t i : indices_) {
    LT_CHECK_INPUT(i >= 0 && i < vocab, "trainable_token_indices: token ", i,
                   " is outside the vocabulary [0, ", vocab, ")");
    LT_CHECK_INPUT(seen.insert(i).second, "trainable_token_indices: token ", i, " is listed twice");
  }
  const Tensor w = model.embed_tokens();
  index_tensor_ = Tensor::from_vector(indices_, {static_cast<int64_t>(indices_.size())}, w.device(),
                                      MemTag::kParam);
  delta_ = Tensor::empty({static_cast<int64_t>(indices_.size()), w.size(1)}, w.dtype(), w.device(),
                         MemTag::kParam);
  {
    NoGradGuard ng;
    ops::copy(delta_, ops::index_rows(w.detach(), index_tensor_));
  }
  delta_.set_name("model.embed_tokens.token_adapter.trainable_tokens_delta");
  delta_.set_param(true).set_requires_grad(true);
}

void TrainableTokens::load_delta(const Tensor& values) {
  LT_CHECK_INPUT(values.shape() == delta_.shape(), "trainable_tokens_delta has shape ",
                 shape_str(values.shape()), ", the token list and the model need ",
                 shape_str(delta_.shape()));
  NoGradGuard ng;
  ops::copy(delta_, values);
}

Tensor TrainableTokens::embed(const Tensor& weight, const Tensor& ids) const {
  if (!enabled_) return kernels::embedding(weight, ids);
  LT_CHECK(!weight.requires_grad(),
           "trainable tokens need a frozen embedding matrix (embed_tokens requires grad)");
  Tensor base = kernels::embedding(weight, ids);
  const std::vector<int64_t> host = ids.to_i64();
  std::unordered_map<int64_t, int64_t> row_of;
  for (size_t j = 0; j < indices_.size(); ++j) row_of.emplace(indices_[j], j);
  std::vector<int64_t> pos, rows;
  for (size_t t = 0; t < host.size(); ++t) {
    auto it = row_of.find(host[t]);
    if (it == row_of.end()) continue;
    pos.push_back(static_cast<int64_t>(t));
    rows.push_back(it->second);
  }
  Tensor y = base;
  if (!pos.empty()) {
    // Gather from [delta; base] with listed positions pointing at their delta row and the
    // others at their own row of `base`: exact copies, a fixed number of kernels whatever the
    // number of listed positions.
    const int64_t n = delta_.size(0), t = base.size(0);
    Tensor table =
        Tensor::empty({n + t, base.size(1)}, base.dtype(), base.device(), MemTag::kWorkspace);
    ops::copy(table.narrow(0, 0, n), delta_.detach());
    ops::copy(table.narrow(0, n, t), base);
    std::vector<int64_t> src(host.size());
    for (int64_t i = 0; i < t; ++i) src[i] = n + i;
    for (size_t k = 0; k < pos.size(); ++k) src[pos[k]] = rows[k];
    y = ops::index_rows(table, i64_on(src, base.device()));
  }
  if (node_needed({delta_})) {
    auto node = std::make_shared<TokensEmbedBackward>();
    node->positions = i64_on(pos, base.device());
    node->rows = i64_on(rows, base.device());
    node->delta_shape = delta_.shape();
    node->set_next_edges({delta_});
    set_history(y, node);
  }
  return y;
}

Tensor TrainableTokens::merged(const Tensor& weight) const {
  NoGradGuard ng;
  Tensor w = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
  ops::copy(w, weight.detach());
  write_rows(w, delta_.detach(), indices_);
  return w;
}

Tensor TrainableTokens::matrix(const Tensor& weight) const {
  if (!enabled_) return weight;
  LT_CHECK(!weight.requires_grad(),
           "trainable tokens need a frozen embedding matrix (embed_tokens requires grad)");
  Tensor w = merged(weight);
  if (node_needed({delta_})) {
    auto node = std::make_shared<TokensMatrixBackward>();
    node->index = index_tensor_;
    node->set_next_edges({delta_});
    set_history(w, node);
  }
  return w;
}

void TrainableTokens::attach(const std::shared_ptr<TrainableTokens>& tokens, DecoderModel& model) {
  LT_CHECK(tokens != nullptr, "TrainableTokens::attach: null");
  model.embedding_override.embed = [tokens](const Tensor& w, const Tensor& ids) {
    return tokens->embed(w, ids);
  };
  if (model.tied())
    model.embedding_override.matrix = [tokens](const Tensor& w) { return tokens->matrix(w); };
  else
    model.embedding_override.matrix = nullptr;
}

void TrainableTokens::detach(DecoderModel& model) {
  model.embedding_override = DecoderModel::EmbeddingOverride{};
}

}  // namespace leantune
