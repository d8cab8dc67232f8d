// The memory of the online trainers' generation batches, planned before the first one is made
// (OnlineTrainer::plan_kv_blocks, check_generation_memory in trainers/online/grpo.h): a batch that
// can never fit is refused in one line naming its options and the numbers, before any of its
// per-completion structures exist (a batch of 10^9 completions grew past 2 GB in seconds).
//
// The device must hold what is allocated when training begins (weights, reference), the KV-cache
// pool and, when the pool is sized for the whole batch (the default), the largest generation
// step's transients (trainers/estimate/estimate_online.h); the host must hold the per-completion
// records (at least the prompt's tokens, the completion's tokens twice and its mask), and on the
// CPU the device's share too. Limits: the allocator's cap (--max_memory_gib or ulimit -v), else the
// device's total memory (CUDA) or the machine's physical memory; for the host, the physical
// memory and the address-space limit.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "engine/allocator.h"
#include "engine/checked_int.h"
#include "engine/cuda_api.h"
#include "models/kv_cache.h"
#include "trainers/estimate/estimate_online.h"
#include "trainers/online/grpo.h"

namespace leantune {

namespace {

int64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : INT64_MAX;
}

int64_t host_limit() {
  int64_t limit = physical_memory();
  rlimit rl{};
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    limit = std::min(limit, static_cast<int64_t>(rl.rlim_cur));
  return limit;
}

// The device's limit and what it is.
std::pair<int64_t, std::string> device_limit(const Device& device) {
  const size_t cap = allocator(device).memory_limit();
  if (cap > 0) return {static_cast<int64_t>(cap), "the allocator's cap"};
  if (device.is_cuda()) {
    size_t free_b = 0, total_b = 0;
    cuda_mem_get_info(device.index, &free_b, &total_b);
    return {static_cast<int64_t>(total_b), device.str() + "'s memory"};
  }
  return {physical_memory(), "the machine's physical memory"};
}

}  // namespace

std::string OnlineTrainer::generation_batch_options() const {
  if (cfg_.algorithm == "online_dpo")
    return "per_device_train_batch_size " + std::to_string(cfg_.completions_per_micro_batch / 2) +
           " prompts x 2 completions, max_new_tokens " +
           std::to_string(cfg_.generation.max_new_tokens);
  return "per_device_train_batch_size " + std::to_string(cfg_.completions_per_micro_batch) +
         " x steps_per_generation " + std::to_string(cfg_.steps_per_generation) +
         ", num_generations " + std::to_string(cfg_.num_generations) + ", max_completion_length " +
         std::to_string(cfg_.generation.max_new_tokens);
}

int64_t OnlineTrainer::plan_kv_blocks() const {
  try {
    const int64_t g = cfg_.num_generations, m = cfg_.generation.max_new_tokens;
    // The reservations of one prompt's generations, and of one generation, at the longest.
    int64_t per_prompt = 1, one = 1, longest = 0;
    for (const PromptRow& r : data_.rows) {
      const int64_t p = static_cast<int64_t>(r.ids.size());
      per_prompt = std::max(per_prompt, kv_blocks_for_prompt(p, g, m, cfg_.kv_block_size));
      if (kv_blocks_for_prompt(p, 1, m, cfg_.kv_block_size) > one)
        one = kv_blocks_for_prompt(p, 1, m, cfg_.kv_block_size), longest = p;
    }
    // Default: a whole generation batch at once.
    const int64_t prompts = (CheckedInt(cfg_.completions_per_micro_batch) *
                             cfg_.steps_per_generation / cfg_.num_generations)
                                .get();
    const int64_t blocks =
        cfg_.kv_cache_blocks > 0 ? cfg_.kv_cache_blocks : (CheckedInt(per_prompt) * prompts).get();
    LT_CHECK_INPUT(blocks >= one, "option --kv_cache_blocks ", blocks, ": one completion of the ",
                   longest, "-token prompt needs ", one, " blocks of ", cfg_.kv_block_size,
                   " tokens");
    return blocks;
  } catch (const OverflowError&) {
    LT_THROW(ErrorKind::kInput, cfg_.algorithm, ": the KV-cache blocks of a generation batch (",
             generation_batch_options(), ") pass 2^63: these options can never run");
  }
}

void OnlineTrainer::check_generation_memory() const {
  using I = CheckedInt;
  const ModelConfig& mc = model_->config();
  const Device device = model_->device();
  int64_t longest = 1;
  for (const PromptRow& r : data_.rows) longest = std::max<int64_t>(longest, r.ids.size());
  const int64_t m = cfg_.generation.max_new_tokens;
  I completions = 0, pool = 0, workspace = 0, host = 0;
  try {
    completions = I(cfg_.completions_per_micro_batch) * cfg_.steps_per_generation;
    pool = kv_pool_bytes(mc, model_->dtype(), kv_blocks_, cfg_.kv_block_size);
    if (cfg_.kv_cache_blocks == 0) {
      OnlineShape s;
      s.prompts_per_generation = (completions / cfg_.num_generations).get();
      s.num_generations = cfg_.num_generations;
      s.prompt_length = longest;
      s.max_new_tokens = m;
      workspace = generation_workspace_bytes(mc, model_->dtype(), s);
    }
    // At least: the record and the prompt's tokens copied per completion, the completion's
    // tokens (generated, then kept) and its mask.
    host = completions *
           (I(sizeof(Rollout)) + 2 * sizeof(std::vector<int32_t>) + I(longest) * 4 + I(m) * 9);
  } catch (const OverflowError&) {
    LT_THROW(ErrorKind::kInput, cfg_.algorithm, ": a generation batch of ",
             generation_batch_options(),
             " needs more than 2^63 bytes (64-bit sizes overflow): these options can never run");
  }
  const int64_t held = allocator(device).stats().allocated.current;
  const auto [dev_limit, dev_what] = device_limit(device);
  const I dev_need = pool + workspace + held;
  const std::string what = cfg_.algorithm + ": a generation batch of " +
                           std::to_string(completions.get()) + " completions (" +
                           generation_batch_options() + ", prompts up to " +
                           std::to_string(longest) + " tokens) needs ";
  const std::string fix =
      "; lower per_device_train_batch_size" +
      std::string(cfg_.algorithm == "online_dpo" ? "" : ", steps_per_generation, num_generations") +
      " or the completion length, or set --kv_cache_blocks (continuous batching)";
  if (dev_need.get() > dev_limit)
    LT_THROW(ErrorKind::kOutOfMemory, what, format_bytes(pool.get()), " of KV-cache pool (",
             kv_blocks_, " blocks of ", cfg_.kv_block_size, " tokens) and ",
             format_bytes(workspace.get()), " of generation transients beside the ",
             format_bytes(held), " already allocated on ", device.str(), ": more than the ",
             format_bytes(dev_limit), " of ", dev_what, fix);
  const I host_need = host + (device.is_cpu() ? dev_need : I(0));
  const int64_t limit = host_limit();
  if (host_need.get() > limit)
    LT_THROW(ErrorKind::kOutOfMemory, what, "at least ", format_bytes(host.get()),
             " of host memory for its per-completion records",
             device.is_cpu() ? " beside " + format_bytes(dev_need.get()) +
                                   " of model, pool and "
                                   "transients"
                             : std::string(),
             ": more than the ", format_bytes(limit), " the host allows", fix);
}

}  // namespace leantune
