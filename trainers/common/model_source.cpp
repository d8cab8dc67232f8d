// The model and dataset options every trainer declares (see model_source.h).
#include "trainers/common/model_source.h"

#include <utility>

namespace leantune {

OptionTable<ModelSource> model_source_table(std::string model_help, std::string dataset_help) {
  return OptionTable<ModelSource>()
      .text("model_name_or_path", &ModelSource::model_name_or_path, std::move(model_help))
      .text("dataset", &ModelSource::dataset, std::move(dataset_help))
      .alias("dataset_name", "dataset");
}

ModelSource model_source(const Options& o) {
  static const OptionTable<ModelSource> names = model_source_table("", "");
  return names.read(o);
}

}  // namespace leantune
