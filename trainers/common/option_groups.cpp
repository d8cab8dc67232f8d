// The option groups every trainer declares (see option_groups.h).
#include "trainers/common/option_groups.h"

#include "trainers/common/data_options.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/quant_options.h"
#include "trainers/common/trainer.h"

namespace leantune {

void add_data_groups(Options& o) {
  add_dataset_options(o);
  add_chat_options(o);
}

void add_row_data_groups(Options& o) {
  row_dataset_table().declare(o);
  add_chat_options(o);
}

void add_model_run_groups(Options& o) {
  add_peft_options(o);
  add_quant_options(o);
  add_training_options(o);
}

}  // namespace leantune
