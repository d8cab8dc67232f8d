// Trainer::load_checkpoint: a run continues from a checkpoint-N folder (weights, optimizer,
// counters, data position and the random streams' offsets: bit for bit as if never stopped).
//
// A checkpoint of N ranks resumes on N ranks with the same zero_stage: each rank reads its own
// optimizer shard (ZeRO) and data position (rank_R.json). A one-process checkpoint (world_size 1:
// written by one process, or merged by `trainer_bin consolidate`) resumes on any number of ranks
// and any zero_stage: every rank reads the whole optimizer state and keeps its pieces
// (ZeroOptimizer::load_state_tensors), and its data position is cut for this rank
// (dist/consolidate.h shard_data_state). Anything else is refused in one line that names
// `trainer_bin consolidate`.
#include <string>
#include <vector>

#include "dist/consolidate.h"
#include "dist/zero.h"
#include "dist/zero3.h"
#include "engine/check.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "trainers/common/checkpoint.h"
#include "trainers/common/trainer.h"

namespace leantune {

void Trainer::load_weights(const std::string& dir) {
  if (zero3_ && (!peft_.active() || zero3_->trains_sharded())) {
    // The checkpoint holds the whole model: every rank loads it and keeps its slices. (A LoRA
    // checkpoint holds the adapters, whole on every rank: nothing to gather.)
    zero3_->acquire_all();
    load_model(dir);
    zero3_->reshard_from_full();
    zero3_->release_all();
  } else {
    load_model(dir);
  }
}

std::string Trainer::load_checkpoint(const std::string& dir) {
  // The small state file first: a corrupt one fails before the weights are read.
  const std::string state_path = checkpoint_state_path(dir);
  const TrainerState st = parse_trainer_state(read_text_file(state_path), state_path);
  LT_CHECK_INPUT(!st.save_only_model, dir,
                 " was saved with save_only_model: it holds the model but not the optimizer state "
                 "a resume needs; start a new run from its weights (--model_name_or_path ",
                 dir, ")");
  Communicator& comm = this->comm();
  const int64_t zero_stage = zero_ ? args_.zero_stage : 0;
  const bool single = st.world_size == 1;
  LT_CHECK_INPUT(single || (st.world_size == comm.size() && st.zero_stage == zero_stage), dir,
                 " was written by ", st.world_size, " rank(s) with zero_stage ", st.zero_stage,
                 "; this run has ", comm.size(), " with zero_stage ", zero_stage,
                 " (resume with the same world size and stage, or run `trainer_bin consolidate ",
                 dir, " --out DIR` and resume from DIR on any)");
  // cp_size decides which micro-batches each rank reads (world / cp data shards).
  LT_CHECK_INPUT(st.cp_size == args_.cp_size, dir, " was written with cp_size ", st.cp_size,
                 "; this run has cp_size ", args_.cp_size, " (resume with the same cp_size)");
  load_weights(dir);
  LT_CHECK_INPUT(st.optim == args_.optim && st.offload_optimizer == args_.offload_optimizer, dir,
                 " holds the state of --optim ", st.optim, " --offload_optimizer ",
                 st.offload_optimizer, "; this run uses --optim ", args_.optim,
                 " --offload_optimizer ", args_.offload_optimizer);
  const std::string opt_path = zero_ && !single ? dir + "/" + rank_optimizer_name(comm.rank())
                                                : dir + "/optimizer.safetensors";
  auto opt_file = SafetensorsFile::open(opt_path);
  std::vector<std::pair<std::string, Tensor>> state;
  for (const auto& e : opt_file->entries()) state.emplace_back(e.name, opt_file->tensor(e.name));
  optimizer_->set_step_count(st.optimizer_step);
  try {
    optimizer_->load_state_tensors(state);
  } catch (const Error& e) {
    LT_THROW(e.kind(), opt_path, ": ", e.what());
  }
  step_ = st.global_step;
  num_tokens_ = st.num_tokens;
  consecutive_nonfinite_ = st.consecutive_nonfinite;
  skipped_steps_ = st.skipped_steps;
  best_ = st.best;
  scheduler_.set_state(st.lr_scheduler, state_path);
  log_history_ = read_log_history(dir);
  nlohmann::json data = st.data_state, rng = st.rng;
  std::string data_source = state_path, note;
  try {
    if (single && comm.size() > 1) {
      data = shard_data_state(st.data_state, comm.rank(), comm.size(), &note);
    } else if (comm.size() > 1) {
      data_source = dir + "/" + rank_state_name(comm.rank());
      const nlohmann::json rs = parse_json_strict(read_text_file(data_source), data_source, 64);
      LT_CHECK_INPUT(rs.is_object() && rs.contains("data_state") && rs["data_state"].is_object(),
                     data_source, ": expected an object with a 'data_state' object");
      data = rs["data_state"];
      if (rs.contains("rng")) rng = parse_rng_state(rs["rng"], data_source);
    }
    set_data_state(data);
  } catch (const Error& e) {
    LT_THROW(e.kind(), data_source, ": data_state: ", e.what());
  }
  // The random streams continue where the checkpoint's step left them (LoRA dropout's masks).
  const std::string rng_note = set_rng_state(rng);
  if (st.consolidated_from > 0 || (single && comm.size() > 1)) {
    std::string from =
        st.consolidated_from > 0
            ? "consolidated from " + std::to_string(st.consolidated_from) + " rank(s)"
            : "written by one process";
    note = dir + " (" + from + ") resumed on " + std::to_string(comm.size()) +
           " rank(s) with zero_stage " + std::to_string(zero_stage) +
           (note.empty() ? "" : "; " + note);
  }
  if (!rng_note.empty()) note = note.empty() ? rng_note : note + "; " + rng_note;
  return note;
}

}  // namespace leantune
