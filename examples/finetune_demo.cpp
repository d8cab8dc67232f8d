// Fine-tunes leantune's embedded demo model through the installed C++ API and prints a sample.
//   finetune_demo [STEPS] [OUTPUT_DIR]
#include <leantune/leantune.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  namespace lt = leantune::api;
  const std::string steps = argc > 1 ? argv[1] : "20";
  const std::string out = argc > 2 ? argv[2] : "finetune_demo_output";
  try {
    lt::Model model = lt::Model::load("");  // "" = the embedded demo model
    lt::Trainer trainer(model, R"({"max_steps": )" + steps + R"(, "output_dir": ")" + out +
                                   R"(", "logging_steps": 5})");
    lt::TrainSummary s = trainer.train([](const lt::StepMetrics& m) {
      std::printf("step %lld/%lld loss %.4f\n", static_cast<long long>(m.step),
                  static_cast<long long>(m.total_steps), m.loss);
      return true;
    });
    std::printf("leantune %s: %lld steps, loss %.4f -> %.4f, peak %lld bytes\n", lt::version(),
                static_cast<long long>(s.steps), s.losses.front(), s.losses.back(),
                static_cast<long long>(model.memory_stats().peak_allocated));
    std::printf("sample: One sunny day,%s\n", model.generate("One sunny day,").c_str());
  } catch (const lt::Error& e) {
    std::fprintf(stderr, "finetune_demo: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
