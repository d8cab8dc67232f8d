// Trainer::save_checkpoint: a checkpoint-N folder of the state after update N (its counterpart,
// Trainer::load_checkpoint, is trainers/common/resume.cpp).
//
// What a checkpoint holds besides the weights and the optimizer (the data position, the token
// count, the random streams' offsets) is a ResumePoint taken when an update begins: a stop in the
// middle of an update (a signal between micro-batches or during a generation) abandons that update
// and saves the point taken before it, so the resumed run repeats it exactly.
//
// Data parallel: rank 0 writes the model, the state files and its own rank files; every
// other rank first stages its own files (its data position and random streams, and under ZeRO its
// optimizer shard) in `.checkpoint-N.tmp-rank-R`, which rank 0 moves into the checkpoint before
// the rename that completes it. A killed save leaves only temporary folders, removed at the next
// start.
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "dist/consolidate.h"
#include "dist/zero.h"
#include "loaders/fs_util.h"
#include "loaders/safetensors.h"
#include "trainers/common/checkpoint.h"
#include "trainers/common/trainer.h"

namespace leantune {

namespace {

// LEANTUNE_TEST_SAVE_PAUSE_MS=N holds every checkpoint save N ms (at most 10 s) with its files
// written and not yet renamed into place, so that a kill-and-resume test lands inside saves
// whatever the machine's load (tests/robustness/kill_resume.sh). Anything but a number is an
// error naming the variable.
void pause_in_save_for_tests() {
  const char* v = std::getenv("LEANTUNE_TEST_SAVE_PAUSE_MS");
  if (!v || !*v) return;
  char* end = nullptr;
  errno = 0;
  const long long ms = std::strtoll(v, &end, 10);
  LT_CHECK_INPUT(*end == '\0' && errno == 0 && ms >= 0 && ms <= 10000,
                 "LEANTUNE_TEST_SAVE_PAUSE_MS=", v, ": expected milliseconds from 0 to 10000");
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace

namespace {

std::string rank_staging_dir(const std::string& output_dir, int64_t step, int rank) {
  return output_dir + "/.checkpoint-" + std::to_string(step) + ".tmp-rank-" + std::to_string(rank);
}

constexpr const char* kLoraDropout = "lora_dropout";

}  // namespace

nlohmann::json Trainer::rng_state() const {
  nlohmann::json s = nlohmann::json::object();
  if (peft_.active() && peft_.runtime->dropout_gen)
    s[kLoraDropout] = peft_.runtime->dropout_gen->offset();
  return s;
}

std::string Trainer::set_rng_state(const nlohmann::json& s) {
  if (!peft_.active() || !peft_.runtime->dropout_gen) return "";
  auto it = s.find(kLoraDropout);
  if (it == s.end())
    return "the checkpoint holds no LoRA dropout offset (written before checkpoints saved it): "
           "the dropout masks start afresh, so this run is not bit-identical to an uninterrupted "
           "one";
  peft_.runtime->dropout_gen->set_offset(it->get<uint64_t>());
  return "";
}

Trainer::ResumePoint Trainer::resume_point() const {
  return {data_state(), epoch_progress(), num_tokens_, rng_state()};
}

void Trainer::write_rank_files(const std::string& dir, int rank, const ResumePoint& at,
                               bool model_only) const {
  std::filesystem::create_directories(dir);
  write_text_atomic(
      dir + "/" + rank_state_name(rank),
      nlohmann::json{{"rank", rank}, {"data_state", at.data_state}, {"rng", at.rng}}.dump(1));
  if (!zero_ || model_only) return;
  // The parameters' shapes let `trainer_bin consolidate` put the pieces back together.
  nlohmann::json shapes = nlohmann::json::array();
  for (const auto& p : trainable_) shapes.push_back({p.name, p.tensor.shape()});
  save_safetensors(
      dir + "/" + rank_optimizer_name(rank), optimizer_->state_tensors(),
      {{"step", std::to_string(optimizer_->step_count())}, {kParamShapesKey, shapes.dump()}});
}

void Trainer::save_checkpoint(int64_t step, MetricsLogger& log, const ResumePoint& at,
                              bool model_only) {
  Communicator& comm = this->comm();
  const bool distributed = comm.size() > 1;
  const AllUnitsGathered gathered(units_whole_for_save(false));
  saved_step_ = step;
  // The best evaluation so far is this step's: this checkpoint holds the best model (every rank
  // records it: load_best_model_at_end loads it on all of them).
  if (best_.metric && best_.step == step)
    best_.checkpoint = args_.output_dir + "/checkpoint-" + std::to_string(step);
  if (distributed && comm.rank() != 0) {
    write_rank_files(rank_staging_dir(args_.output_dir, step, comm.rank()), comm.rank(), at,
                     model_only);
    comm.barrier();  // staged
    take_part_in_save();
    comm.barrier();  // rank 0 has completed the checkpoint
    return;
  }
  if (distributed) comm.barrier();  // every rank has staged its files
  const std::string path = write_checkpoint(args_.output_dir, step, [&](const std::string& dir) {
    save_model(dir, false);
    if (!zero_ && !model_only)
      save_safetensors(dir + "/optimizer.safetensors", optimizer_->state_tensors(),
                       {{"step", std::to_string(optimizer_->step_count())}});
    if (distributed) {
      write_rank_files(dir, 0, at, model_only);
      for (int r = 1; r < comm.size(); ++r) {
        const std::string staged = rank_staging_dir(args_.output_dir, step, r);
        for (const std::string& name : {rank_state_name(r), rank_optimizer_name(r)})
          if (std::filesystem::exists(staged + "/" + name))
            std::filesystem::rename(staged + "/" + name, dir + "/" + name);
        std::filesystem::remove_all(staged);
      }
    }
    nlohmann::json st = {{"global_step", step},
                         {"epoch", at.epoch},
                         {"num_tokens", at.num_tokens},
                         {"consecutive_nonfinite", consecutive_nonfinite_},
                         {"skipped_steps", skipped_steps_},
                         {"optimizer_step", optimizer_->step_count()},
                         {"optim", args_.optim},
                         {"offload_optimizer", args_.offload_optimizer},
                         {"world_size", comm.size()},
                         {"zero_stage", zero_ ? args_.zero_stage : 0},
                         {"cp_size", args_.cp_size},
                         {"total_steps", total_steps_},
                         {"data_state", at.data_state},
                         {"rng", at.rng},
                         {"best", best_to_json(best_)},
                         {"lr_scheduler", scheduler_.state()},
                         {"options", options_.to_json()}};
    if (model_only) st["save_only_model"] = true;
    write_text_atomic(dir + "/" + kCheckpointStateFile, st.dump(1));
    write_text_atomic(dir + "/trainer_state.json", hf_trainer_state(at.epoch).dump(2));
    if (save_hook_) save_hook_(dir);
    pause_in_save_for_tests();
  });
  rotate_checkpoints(args_.output_dir, args_.save_total_limit, best_.checkpoint);
  log.message("saved " + path);
  if (distributed) comm.barrier();
}

}  // namespace leantune
