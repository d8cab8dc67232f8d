# Fuzz targets of the parsers a user's files reach (beside fuzz_safetensors and fuzz_tokenizer,
# wired in tests/loaders/):
#   fuzz_jsonl             the JSONL dataset reader (loaders/dataset.h)
#   fuzz_options           --config files: parse_config_json + Options::apply_config_text
#   fuzz_yaml_config       --config F.yaml: parse_yaml_config (libyaml) + Options::apply_json
#   fuzz_checkpoint_state  trainer_state.json: parse_trainer_state (trainers/common/checkpoint.h)
# Each has a plain corpus driver, <name>_corpus, that ctest runs over tests/fuzz/corpus/<dir>
# (good_* accepted, bad_* rejected), and, with LEANTUNE_FUZZ=ON and clang, a libFuzzer build with
# ASan + UBSan compiled from the sources it needs:
#   cmake -S . -B build-fuzz -DLEANTUNE_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
#         -DCMAKE_C_COMPILER=clang -DLEANTUNE_CUDA=OFF
#   cmake --build build-fuzz --target fuzz_options
#   cp -r tests/fuzz/corpus/options /tmp/c && build-fuzz/fuzz_options -max_total_time=600 /tmp/c
set(_lt_fuzz_dir ${PROJECT_SOURCE_DIR}/tests/fuzz)
set(_lt_fuzz_common ${PROJECT_SOURCE_DIR}/engine/check.cpp ${PROJECT_SOURCE_DIR}/loaders/fs_util.cpp)
set(_lt_fuzz_jsonl_src ${PROJECT_SOURCE_DIR}/loaders/dataset.cpp
    ${PROJECT_SOURCE_DIR}/loaders/jsonl.cpp)
set(_lt_fuzz_options_src ${PROJECT_SOURCE_DIR}/loaders/options.cpp
    ${PROJECT_SOURCE_DIR}/loaders/yaml_config.cpp ${PROJECT_SOURCE_DIR}/loaders/unicode.cpp)
set(_lt_fuzz_yaml_config_src ${_lt_fuzz_options_src})
set(_lt_fuzz_checkpoint_state_src ${PROJECT_SOURCE_DIR}/trainers/common/checkpoint.cpp
    ${PROJECT_SOURCE_DIR}/trainers/common/evaluation.cpp ${_lt_fuzz_options_src})

foreach(name jsonl options yaml_config checkpoint_state)
  add_executable(fuzz_${name}_corpus ${_lt_fuzz_dir}/fuzz_${name}.cpp)
  target_link_libraries(fuzz_${name}_corpus PRIVATE leantune)
  target_include_directories(fuzz_${name}_corpus PRIVATE ${PROJECT_SOURCE_DIR})
  add_test(NAME fuzz_${name}_corpus
           COMMAND fuzz_${name}_corpus ${_lt_fuzz_dir}/corpus/${name})
  set_tests_properties(fuzz_${name}_corpus PROPERTIES LABELS "cpu;fuzz;robustness" TIMEOUT 300)
  if(LEANTUNE_FUZZ AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    add_executable(fuzz_${name} ${_lt_fuzz_dir}/fuzz_${name}.cpp ${_lt_fuzz_${name}_src}
                   ${_lt_fuzz_common})
    target_include_directories(fuzz_${name} PRIVATE ${PROJECT_SOURCE_DIR})
    target_link_libraries(fuzz_${name} PRIVATE nlohmann_json::nlohmann_json PkgConfig::YAML
                          ${UTF8PROC_LIB})
    target_compile_definitions(fuzz_${name} PRIVATE LEANTUNE_LIBFUZZER=1)
    target_compile_options(fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined
                           -fno-omit-frame-pointer)
    target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  endif()
endforeach()
