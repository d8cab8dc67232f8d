// What an HPC pipeline sets besides the training options (docs/embedding.md): its own MPI
// communicator (here each half of the job trains a run of its own), a log sink, its own SIGTERM
// handling, and training rows from memory.
//   mpirun -np 4 hpc_pipeline [STEPS] [OUTPUT_DIR]   (or without mpirun: one run on one rank)
#include <mpi.h>
// mpi.h first: leantune.h then declares leantune::api::mpi_comm(MPI_Comm).
#include <leantune/leantune.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

namespace lt = leantune::api;

namespace {

// The pipeline's own handler: a preemption notice stops training with a checkpoint.
void on_sigterm(int) { lt::request_stop(); }

const char* level_name(lt::LogLevel l) {
  switch (l) {
    case lt::LogLevel::kDebug:
      return "debug";
    case lt::LogLevel::kInfo:
      return "info";
    case lt::LogLevel::kWarning:
      return "warning";
    case lt::LogLevel::kError:
      return "error";
  }
  return "?";
}

int run(int argc, char** argv) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string steps = argc > 1 ? argv[1] : "10";
  const std::string out = argc > 2 ? argv[2] : "hpc_pipeline_output";
  // Two halves of the job, two independent runs (one run when the job has one rank).
  const int color = size >= 2 ? rank * 2 / size : 0;
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, color, rank, &half);
  int half_rank = 0;
  MPI_Comm_rank(half, &half_rank);

  // Progress lines and warnings into the pipeline's log (here: stdout, tagged), rank 0 only.
  if (half_rank == 0)
    lt::set_log_sink([color](lt::LogLevel l, const std::string& line) {
      std::printf("[run %d %s] %s\n", color, level_name(l), line.c_str());
    });
  else
    lt::set_log_sink([](lt::LogLevel, const std::string&) {}, lt::LogLevel::kError);

  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);

  lt::TrainerSetup setup;
  setup.communicator = lt::mpi_comm(half);
  setup.install_signal_handlers = false;
  // Rows the pipeline produced itself (JSONL objects; {"input_ids": [...]} works too).
  std::vector<std::string> rows;
  const char* stories[] = {"One sunny day, Mia found a red ball in the park.",
                           "Tom and his dog ran to the big tree by the lake.",
                           "The little bird sang a happy song every morning.",
                           "Lily baked a cake with her mom and shared it."};
  for (int i = 0; i < 32; ++i)
    rows.push_back(std::string(R"({"text": ")") + stories[(i + color) % 4] + "\"}");
  setup.dataset_rows = rows;

  {
    lt::Model model = lt::Model::load("");  // "" = the embedded demo model
    lt::Trainer trainer(model,
                        R"({"max_steps": )" + steps + R"(, "output_dir": ")" + out + "/run" +
                            std::to_string(color) +
                            R"(", "max_length": 64, "per_device_train_batch_size": 2, )"
                            R"("learning_rate": 3e-3, "logging_steps": 5})",
                        setup);
    const lt::TrainSummary s = trainer.train();
    if (half_rank == 0)
      std::printf("run %d: %lld steps, loss %.4f -> %.4f%s\n", color,
                  static_cast<long long>(s.steps), s.losses.front(), s.losses.back(),
                  s.stopped_early ? " (stopped, checkpoint saved)" : "");
  }
  MPI_Comm_free(&half);
  lt::set_log_sink({});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const lt::Error& e) {
    std::fprintf(stderr, "hpc_pipeline: %s\n", e.what());
    code = e.exit_code();
  }
  if (code != 0) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  return code;
}
