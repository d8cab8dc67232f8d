# Tokenizer wiring beyond the plain test binaries (loaders_test_tokenizer and
# loaders_test_chat_template, built by tests/CMakeLists):
#   - fuzz_tokenizer_corpus: drives tests/fuzz/fuzz_tokenizer.cpp over the committed seed corpus
#     with the tokenizer sources compiled in under AddressSanitizer + UBSan, so the fuzz entry
#     point runs (instrumented) in every ctest run without clang;
#   - fuzz_tokenizer: the libFuzzer target, with LEANTUNE_FUZZ=ON and clang only:
#       cmake -DLEANTUNE_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang ...
# (trainer_bin tokenize is exercised by loaders_test_tokenizer's TokenizeCommand tests.)

file(GLOB _lt_jinja_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/loaders/jinja/*.cpp)
file(GLOB _lt_tok_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/loaders/tokenizer*.cpp)
list(APPEND _lt_tok_sources
    ${PROJECT_SOURCE_DIR}/loaders/fs_util.cpp
    ${PROJECT_SOURCE_DIR}/loaders/chat_template.cpp
    ${_lt_jinja_sources}
    ${LT_BUNDLED_TEMPLATES_CPP}
    ${PROJECT_SOURCE_DIR}/loaders/bpe.cpp
    ${PROJECT_SOURCE_DIR}/loaders/unicode.cpp
    ${PROJECT_SOURCE_DIR}/engine/check.cpp)
set(_lt_tok_fuzz_src ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_tokenizer.cpp)
set(_lt_tok_fixture ${PROJECT_SOURCE_DIR}/tests/fixtures/tokenizers/qwen2.5)

# The tokenizer needs only these sources and libraries, so it is built standalone (every line
# instrumented) instead of linking the uninstrumented libleantune.
function(_lt_tok_standalone tgt)
  target_include_directories(${tgt} PRIVATE ${PROJECT_SOURCE_DIR} ${UTF8PROC_INCLUDE})
  target_link_libraries(${tgt} PRIVATE nlohmann_json::nlohmann_json PkgConfig::PCRE2
                        ${UTF8PROC_LIB})
  target_compile_definitions(${tgt} PRIVATE LT_FUZZ_TOKENIZER_DIR="${_lt_tok_fixture}")
endfunction()

add_executable(fuzz_tokenizer_corpus ${_lt_tok_fuzz_src} ${_lt_tok_sources})
_lt_tok_standalone(fuzz_tokenizer_corpus)
target_compile_options(fuzz_tokenizer_corpus PRIVATE -fsanitize=address,undefined
                       -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
target_link_options(fuzz_tokenizer_corpus PRIVATE -fsanitize=address,undefined)
add_test(NAME fuzz_tokenizer_corpus
         COMMAND fuzz_tokenizer_corpus ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/tokenizer)
set_tests_properties(fuzz_tokenizer_corpus PROPERTIES LABELS "cpu;loaders;fuzz" TIMEOUT 600
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

if(LEANTUNE_FUZZ)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    add_executable(fuzz_tokenizer ${_lt_tok_fuzz_src} ${_lt_tok_sources})
    _lt_tok_standalone(fuzz_tokenizer)
    target_compile_definitions(fuzz_tokenizer PRIVATE LEANTUNE_LIBFUZZER=1)
    target_compile_options(fuzz_tokenizer PRIVATE -fsanitize=fuzzer,address,undefined
                           -fno-omit-frame-pointer)
    target_link_options(fuzz_tokenizer PRIVATE -fsanitize=fuzzer,address,undefined)
  else()
    message(WARNING "LEANTUNE_FUZZ needs clang (-DCMAKE_CXX_COMPILER=clang++); "
                    "fuzz_tokenizer is not built")
  endif()
endif()
