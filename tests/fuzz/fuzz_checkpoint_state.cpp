// Fuzz target for the checkpoint state reader: arbitrary bytes are a trainer_state.json, parsed
// by parse_trainer_state (trainers/common/checkpoint.h). A rejection must be an Error of kind
// kInput; anything else (a crash, a sanitizer report, another exception, an internal Error) aborts.
// An accepted state has non-negative counters and an object data_state. Builds:
// fuzz_checkpoint_state_corpus (ctest, over tests/fuzz/corpus/checkpoint_state) and, with clang and
// LEANTUNE_FUZZ=ON, the libFuzzer target fuzz_checkpoint_state (fuzz.cmake).
#include <cstdlib>
#include <string_view>

#include "engine/check.h"
#include "tests/fuzz/fuzz_corpus_main.h"
#include "trainers/common/checkpoint.h"

bool fuzz_accepts(const uint8_t* data, size_t size) {
  try {
    const leantune::TrainerState st = leantune::parse_trainer_state(
        std::string_view(reinterpret_cast<const char*>(data), size), "trainer_state.json");
    if (st.global_step < 0 || st.optimizer_step < 0 || st.num_tokens < 0 ||
        st.consecutive_nonfinite < 0 || st.skipped_steps < 0 || !st.data_state.is_object())
      std::abort();
    return true;
  } catch (const leantune::Error& e) {
    if (e.kind() != leantune::ErrorKind::kInput) {
      std::fprintf(stderr, "internal error on fuzz input: %s\n", e.what());
      std::abort();
    }
    return false;
  }
}
