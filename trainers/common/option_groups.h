// The option groups the trainers declare after their own options, in --help order, each group a
// table of its own (read by that table):
//   add_data_groups        dataset (trainers/common/data_options.h: dataset_text_field, ...)
//                          and chat (chat_template, chat_template_kwargs): sft's
//   add_row_data_groups    skip_bad_lines and chat: the trainers that read whole rows (dpo,
//                          kto, reward), whose losses take no loss-mask options
//   add_model_run_groups   PEFT (peft_options.h), quantized base (quant_options.h) and the
//                          training arguments (trainer.h training_table: batch sizes, optimizer,
//                          schedule, checkpoints, offloading, distribution)
#pragma once

#include "loaders/options.h"

namespace leantune {

void add_data_groups(Options& o);
void add_row_data_groups(Options& o);
void add_model_run_groups(Options& o);

}  // namespace leantune
