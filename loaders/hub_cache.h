// Hugging Face Hub IDs ("Org/Name") resolved in the local cache, as transformers resolves them
// offline (HF_HUB_OFFLINE=1): the cache folder is $HF_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; a model is
// models--Org--Name/snapshots/<commit>/, and the revision (default "main") is a branch or tag
// whose commit refs/<revision> holds, or a commit hash. Nothing is downloaded: leantune reaches no
// network.
#pragma once

#include <string>

namespace leantune {

// The folder name_or_path means: itself when it exists (a local folder or file), else its
// snapshot in the Hub cache. Error(kInput) naming `option` when it is neither: a path that does
// not exist, or an ID absent from the cache (with the cache folder looked in and the command
// that downloads it).
std::string resolve_model_path(const std::string& name_or_path, const std::string& option,
                               const std::string& revision = "main");

// The cache folder (the first of the variables above that is set).
std::string hub_cache_dir();
// Whether the cache holds the repository of `id` (any revision).
bool in_hub_cache(const std::string& id);

}  // namespace leantune
