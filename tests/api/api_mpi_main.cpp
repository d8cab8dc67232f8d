// An embedder's MPI communicator through the public API (TrainerSetup::communicator), run by
// api_mpi.sh under mpirun:
//   api_mpi_main world OUT [ALGORITHM]   every rank of MPI_COMM_WORLD trains one run (no
//                                        communicator given)
//   api_mpi_main halves OUT [ALGORITHM]  the world is split into two halves (ranks 0-1 and 2-3
//                                        of 4), each half trains its own run over its
//                                        sub-communicator at the same time
// ALGORITHM: TrainerSetup::algorithm (sft unless given), on the embedded demo.
// Rank 0 of each run writes its losses (%.17g, one a line) to OUT/losses (world) or
// OUT/losses_half<H> (halves). Only the public header is used, as a pipeline would; mpi.h first,
// so that leantune::api::mpi_comm is declared.
#include <mpi.h>
// mpi.h must come first: the public header's mpi_comm() helper is declared when MPI_VERSION is.
#include <leantune/leantune.h>

#include <cstdio>
#include <string>

namespace lt = leantune::api;

namespace {

int run(const std::string& mode, const std::string& out, const std::string& algorithm) {
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  lt::TrainerSetup setup;
  setup.algorithm = algorithm;
  std::string run_dir = out + "/world", losses = out + "/losses";
  MPI_Comm half = MPI_COMM_NULL;
  if (mode == "halves") {
    if (world_size != 4) {
      std::fprintf(stderr, "api_mpi_main halves: needs 4 ranks, got %d\n", world_size);
      return 2;
    }
    const int color = world_rank / 2;
    MPI_Comm_split(MPI_COMM_WORLD, color, world_rank, &half);
    setup.communicator = lt::mpi_comm(half);
    run_dir = out + "/half" + std::to_string(color);
    losses = out + "/losses_half" + std::to_string(color);
  } else if (mode != "world") {
    std::fprintf(stderr, "api_mpi_main: unknown mode %s\n", mode.c_str());
    return 2;
  }
  std::vector<double> got;
  {
    lt::Model model = lt::Model::load("");
    lt::Trainer trainer(model,
                        R"({"max_steps": 3, "max_length": 48, "per_device_train_batch_size": 2, )"
                        R"("deterministic_comm": true, "logging_steps": 100, "output_dir": ")" +
                            run_dir + "\"}",
                        setup);
    got = trainer.train().losses;
  }
  int rank_in_run = world_rank;
  if (half != MPI_COMM_NULL) {
    MPI_Comm_rank(half, &rank_in_run);
    MPI_Comm_free(&half);
  }
  if (rank_in_run == 0) {
    std::FILE* f = std::fopen(losses.c_str(), "w");
    if (!f) return 1;
    for (double l : got) std::fprintf(f, "%.17g\n", l);
    std::fclose(f);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int code = 0;
  try {
    code = argc == 3 || argc == 4 ? run(argv[1], argv[2], argc == 4 ? argv[3] : "sft") : 2;
  } catch (const lt::Error& e) {
    std::fprintf(stderr, "api_mpi_main: %s\n", e.what());
    code = e.exit_code();
  }
  if (code != 0) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  return code;
}
