// The reference model of the preference trainers: see the header.
#include "models/ref_model.h"

#include <cstdio>
#include <filesystem>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/mem_phase.h"
#include "engine/offload.h"
#include "engine/ops.h"
#include "kernels/cross_entropy.h"

namespace leantune {

kernels::SequenceLogprobs sequence_logps(const DecoderModel& model, const Batch& b,
                                         const SequenceLogpsOptions& opts) {
  LT_CHECK(b.input_ids.defined() && b.labels.defined() && b.cu_seqlens.defined(),
           "sequence_logps on an empty batch");
  const Device dev = model.device();
  Tensor ids = b.input_ids.to(dev), pos = b.position_ids.to(dev), cu = b.cu_seqlens.to(dev);
  LT_CHECK_INPUT(model.logit_softcap() == 0, model.config().architecture,
                 ": sequence log-probabilities of a model with final_logit_softcapping are not "
                 "supported (preference and RL trainers); sft and generation are");
  LT_CHECK(!opts.context_parallel || !opts.per_token,
           "sequence_logps: per-token log-probabilities under context parallelism");
  Tensor hidden = model.hidden_states(ids, pos, cu, seq_hints(b), opts.gradient_checkpointing,
                                      nullptr, opts.context_parallel);
  NoOffloadScope head;
  MemSiteGuard site("lm_head + log-probabilities");
  const Tensor targets =
      opts.context_parallel ? b.labels : kernels::shift_labels(b.labels, b.cu_seqlens);
  kernels::SequenceLogprobsOptions ko;
  ko.chunk_tokens = opts.chunk_tokens;
  ko.logit_sums = opts.logit_sums;
  ko.row_stats = opts.row_stats;
  LT_CHECK(opts.temperature > 0, "sequence_logps: temperature ", opts.temperature,
           " must be positive");
  ko.logit_scale = 1.0 / opts.temperature;
  // per_token: every row is its own "sequence" of the log-probability sums (the model's
  // attention still sees the batch's sequences).
  Tensor cu_logps = b.cu_seqlens;
  if (opts.per_token) {
    std::vector<int64_t> rows(static_cast<size_t>(b.input_ids.numel()) + 1);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
    cu_logps = Tensor::from_vector(rows, {static_cast<int64_t>(rows.size())});
  }
  ParamUse use(model.param_residency(), ParamResidency::kOuterUnit);
  if (opts.fused)
    return kernels::linear_sequence_logprobs(hidden, model.lm_head_weight(), targets, cu_logps, ko);
  return kernels::logits_sequence_logprobs(model.logits(hidden), targets, cu_logps, ko);
}

namespace {

class SequenceGradientLossBackward final : public Node {
 public:
  std::vector<double> grad;
  DType dtype = DType::kF32;
  Device device = Device::cpu();
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    const double g = grads[0].item();
    std::vector<double> v = grad;
    for (double& x : v) x *= g;
    return {Tensor::from_doubles(v, {static_cast<int64_t>(v.size())}, dtype).to(device)};
  }
  std::string name() const override { return "SequenceGradientLossBackward"; }
};

}  // namespace

Tensor loss_from_sequence_gradient(const Tensor& logps, double value, std::vector<double> grad) {
  LT_CHECK(logps.dim() == 1 && static_cast<int64_t>(grad.size()) == logps.numel(),
           "loss_from_sequence_gradient: ", grad.size(), " gradients for ", logps.str());
  Tensor out = Tensor::full({}, value, logps.dtype(), logps.device());
  if (node_needed({logps})) {
    auto node = std::make_shared<SequenceGradientLossBackward>();
    node->set_next_edges({logps});
    node->grad = std::move(grad);
    node->dtype = logps.dtype();
    node->device = logps.device();
    set_history(out, node);
  }
  return out;
}

const OptionTable<RefModelConfig>& ref_model_table() {
  using C = RefModelConfig;
  static const OptionTable<C> t =
      OptionTable<C>()
          .text("ref_model", &C::ref_model,
                "HF folder of a separate frozen reference model (empty: the policy's own weights "
                "with adapters off under use_peft, else a frozen copy of the initial policy)")
          .flag("ref_load_in_4bit", &C::ref_load_in_4bit,
                "load --ref_model with NF4 weights (needs ref_model)")
          .flag("precompute_ref_log_probs", &C::precompute,
                "compute the reference log-probabilities once before training and keep no "
                "reference model during training")
          .integer_or_none("precompute_ref_batch_size", &C::precompute_batch_size,
                           "batch size of the precompute pass (none: per_device_eval_batch_size)",
                           1);
  return t;
}

void add_ref_model_options(Options& o) { ref_model_table().declare(o); }

RefModelConfig ref_model_config(const Options& o, int64_t per_device_eval_batch_size) {
  RefModelConfig c = ref_model_table().read(o);
  if (!c.precompute_batch_size) c.precompute_batch_size = per_device_eval_batch_size;
  LT_CHECK_INPUT(!c.ref_load_in_4bit || !c.ref_model.empty(),
                 "option --ref_load_in_4bit needs --ref_model (the policy's own base is "
                 "quantized with --load_in_4bit)");
  if (!c.ref_model.empty())
    LT_CHECK_INPUT(std::filesystem::is_directory(c.ref_model), "option --ref_model: '", c.ref_model,
                   "' is not a model folder");
  return c;
}

const char* ref_mode_name(RefMode m) {
  switch (m) {
    case RefMode::kPrecomputed:
      return "precomputed";
    case RefMode::kAdaptersOff:
      return "adapters_off";
    case RefMode::kInitialAdapter:
      return "initial_adapter";
    case RefMode::kSeparateModel:
      return "ref_model";
    case RefMode::kPolicyCopy:
      return "policy_copy";
  }
  return "?";
}

namespace {

int64_t param_bytes(Device dev) {
  return allocator(dev).stats().by_tag[static_cast<int>(MemTag::kParam)].current;
}

}  // namespace

ReferenceModel::ReferenceModel(RefModelConfig cfg, std::shared_ptr<DecoderModel> policy,
                               PeftSetup* peft)
    : cfg_(std::move(cfg)), policy_(std::move(policy)), peft_(peft) {
  if (!cfg_.ref_model.empty())
    source_ = RefMode::kSeparateModel;
  else if (peft_ && peft_->active())
    source_ = cfg_.adapter_loaded ? RefMode::kInitialAdapter : RefMode::kAdaptersOff;
  else
    source_ = RefMode::kPolicyCopy;
  mode_ = cfg_.precompute ? RefMode::kPrecomputed : source_;
  // The adapters-off mode needs the adapters switchable (not with modules_to_save): checked
  // before anything trains.
  if (source_ == RefMode::kAdaptersOff) {
    peft_->set_adapters_enabled(false);
    peft_->set_adapters_enabled(true);
  }
  const Device dev = policy_->device();
  const int64_t before = param_bytes(dev);
  if (source_ == RefMode::kSeparateModel) {
    QuantConfig q;
    q.load_in_4bit = cfg_.ref_load_in_4bit;
    q.compute_dtype = policy_->dtype();
    ref_ = q.enabled() ? load_quantized(cfg_.ref_model, dev, policy_->dtype(), q, &quant_report_)
                       : std::shared_ptr<DecoderModel>(
                             DecoderModel::load(cfg_.ref_model, dev, policy_->dtype()));
    LT_CHECK_INPUT(ref_->config().vocab_size == policy_->config().vocab_size,
                   "option --ref_model: '", cfg_.ref_model, "' has vocab_size ",
                   ref_->config().vocab_size, " but the policy has ", policy_->config().vocab_size);
  } else if (source_ == RefMode::kPolicyCopy) {
    // Full fine-tuning: the initial weights are the reference, frozen in a second copy.
    ref_ = std::make_shared<DecoderModel>(policy_->config(), dev, policy_->dtype());
    const auto src = policy_->named_parameters();
    const auto dst = ref_->named_parameters();
    LT_CHECK(src.size() == dst.size(), "reference copy: ", src.size(), " vs ", dst.size(),
             " parameters");
    for (size_t i = 0; i < src.size(); ++i) ops::copy(dst[i].second, src[i].second.detach());
  }
  if (source_ == RefMode::kInitialAdapter)
    for (const auto& [name, t] : peft_->trainable_parameters(*policy_))
      initial_adapter_.emplace_back(t, t.detach().clone(MemTag::kParam));
  if (ref_) ref_->set_requires_grad(false);
  ref_bytes_loaded_ = param_bytes(dev) - before;
}

std::vector<double> ReferenceModel::forward(const Batch& b, const SequenceLogpsOptions& opts) {
  NoGradGuard ng;
  MemPhaseGuard phase(MemPhaseKind::kEvaluation);
  SequenceLogpsOptions o = opts;
  o.gradient_checkpointing = false;
  o.logit_sums = false;
  if (source_ == RefMode::kAdaptersOff) {
    peft_->set_adapters_enabled(false);
    try {
      kernels::SequenceLogprobs r = sequence_logps(*policy_, b, o);
      peft_->set_adapters_enabled(true);
      return r.logps.to_f64();
    } catch (...) {
      peft_->set_adapters_enabled(true);
      throw;
    }
  }
  if (source_ == RefMode::kInitialAdapter) {
    // Swap the initial adapter values in for the forward, the trained ones back after it.
    std::vector<Tensor> now;
    for (const auto& [live, init] : initial_adapter_) {
      now.push_back(live.detach().clone(MemTag::kWorkspace));
      ops::copy(live.detach(), init);
    }
    const bool training = peft_->runtime && peft_->runtime->training;
    auto restore = [&] {
      for (size_t i = 0; i < now.size(); ++i) ops::copy(initial_adapter_[i].first.detach(), now[i]);
      peft_->set_training(training);
    };
    peft_->set_training(false);
    try {
      kernels::SequenceLogprobs r = sequence_logps(*policy_, b, o);
      restore();
      return r.logps.to_f64();
    } catch (...) {
      restore();
      throw;
    }
  }
  LT_CHECK(ref_ != nullptr, "reference model used after it was freed");
  return sequence_logps(*ref_, b, o).logps.to_f64();
}

std::vector<double> ReferenceModel::logps(const Batch& b, const std::vector<int64_t>& keys,
                                          const SequenceLogpsOptions& opts) {
  if (mode_ != RefMode::kPrecomputed) return forward(b, opts);
  LT_CHECK(done_, "precomputed reference log-probabilities asked for before precompute()");
  std::vector<double> out;
  out.reserve(keys.size());
  for (int64_t k : keys) {
    auto it = cache_.find(k);
    LT_CHECK(it != cache_.end(), "no precomputed reference log-probability for sequence ", k);
    out.push_back(it->second);
  }
  return out;
}

void ReferenceModel::precompute(
    int64_t num_batches, const std::function<std::pair<Batch, std::vector<int64_t>>(int64_t)>& make,
    const SequenceLogpsOptions& opts) {
  if (mode_ != RefMode::kPrecomputed || done_) return;
  StepPhaseGuard phase("reference precompute");
  for (int64_t i = 0; i < num_batches; ++i) {
    auto [batch, keys] = make(i);
    const std::vector<double> v = forward(batch, opts);
    LT_CHECK(v.size() == keys.size(), "precompute: ", keys.size(), " keys for ", v.size(),
             " sequences");
    for (size_t j = 0; j < v.size(); ++j) cache_[keys[j]] = v[j];
  }
  ref_.reset();  // nothing of the reference is kept during training
  initial_adapter_.clear();
  done_ = true;
}

int64_t ReferenceModel::held_bytes() const {
  return ref_ || !initial_adapter_.empty() ? ref_bytes_loaded_ : 0;
}

nlohmann::json ReferenceModel::memory_json() const {
  nlohmann::json j = {{"mode", ref_mode_name(mode_)},
                      {"source", ref_mode_name(source_)},
                      {"held_bytes", held_bytes()},
                      {"loaded_bytes", ref_bytes_loaded_},
                      {"cached_sequences", static_cast<int64_t>(cache_.size())},
                      {"cache_bytes", static_cast<int64_t>(cache_.size()) * 16}};
  if (quant_report_.quantized_modules > 0)
    j["quantized"] = {{"modules", quant_report_.quantized_modules},
                      {"dense_bytes", quant_report_.dense_bytes},
                      {"quantized_bytes", quant_report_.quantized_bytes}};
  return j;
}

std::string format_reference_memory(const nlohmann::json& r) {
  const std::string mode = r.value("mode", "");
  const int64_t held = r.value("held_bytes", int64_t{0});
  const int64_t loaded = r.value("loaded_bytes", int64_t{0});
  char line[320];
  if (mode == "precomputed") {
    std::snprintf(line, sizeof line,
                  "    reference model: precomputed (%lld sequences cached, %s); no reference "
                  "weights held during training%s%s\n",
                  static_cast<long long>(r.value("cached_sequences", int64_t{0})),
                  format_bytes(r.value("cache_bytes", int64_t{0})).c_str(),
                  loaded > 0 ? ", the pass's model freed: " : "",
                  loaded > 0 ? format_bytes(loaded).c_str() : "");
  } else if (mode == "adapters_off") {
    std::snprintf(line, sizeof line,
                  "    reference model: the policy's base weights with adapters off; 0 B extra "
                  "(no second copy of the base)\n");
  } else if (mode == "initial_adapter") {
    std::snprintf(line, sizeof line,
                  "    reference model: the policy's base with the adapter as loaded; %s for the "
                  "adapter's initial values (no second copy of the base)\n",
                  format_bytes(held).c_str());
  } else if (mode == "ref_model") {
    const bool q = r.contains("quantized");
    std::snprintf(line, sizeof line,
                  "    reference model: a separate frozen model, %s of weights%s\n",
                  format_bytes(held).c_str(), q ? " (NF4)" : "");
  } else {
    std::snprintf(line, sizeof line,
                  "    reference model: a frozen copy of the initial policy, %s of weights\n",
                  format_bytes(held).c_str());
  }
  return line;
}

}  // namespace leantune
