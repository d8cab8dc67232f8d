# Jinja interpreter fuzzing (the test binaries loaders_test_jinja / loaders_test_chat_template are
# built by tests/CMakeLists):
#   - fuzz_jinja_corpus: drives tests/fuzz/fuzz_jinja.cpp over the committed seed corpus
#     (tests/fuzz/corpus/jinja: the fixture templates and malformed ones) with the interpreter
#     compiled in under AddressSanitizer + UBSan, in every ctest run, without clang;
#   - fuzz_jinja: the libFuzzer target, with LEANTUNE_FUZZ=ON and clang only.
file(GLOB _lt_jinja_fuzz_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/loaders/jinja/*.cpp)
list(APPEND _lt_jinja_fuzz_sources ${PROJECT_SOURCE_DIR}/engine/check.cpp)
set(_lt_jinja_fuzz_src ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_jinja.cpp)

add_executable(fuzz_jinja_corpus ${_lt_jinja_fuzz_src} ${_lt_jinja_fuzz_sources})
target_include_directories(fuzz_jinja_corpus PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(fuzz_jinja_corpus PRIVATE nlohmann_json::nlohmann_json)
target_compile_options(fuzz_jinja_corpus PRIVATE -fsanitize=address,undefined
                       -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
target_link_options(fuzz_jinja_corpus PRIVATE -fsanitize=address,undefined)
add_test(NAME fuzz_jinja_corpus
         COMMAND fuzz_jinja_corpus ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/jinja)
set_tests_properties(fuzz_jinja_corpus PROPERTIES LABELS "cpu;loaders;fuzz" TIMEOUT 600
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

if(LEANTUNE_FUZZ)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    add_executable(fuzz_jinja ${_lt_jinja_fuzz_src} ${_lt_jinja_fuzz_sources})
    target_include_directories(fuzz_jinja PRIVATE ${PROJECT_SOURCE_DIR})
    target_link_libraries(fuzz_jinja PRIVATE nlohmann_json::nlohmann_json)
    target_compile_definitions(fuzz_jinja PRIVATE LEANTUNE_LIBFUZZER=1)
    target_compile_options(fuzz_jinja PRIVATE -fsanitize=fuzzer,address,undefined
                           -fno-omit-frame-pointer)
    target_link_options(fuzz_jinja PRIVATE -fsanitize=fuzzer,address,undefined)
  else()
    message(WARNING "LEANTUNE_FUZZ needs clang (-DCMAKE_CXX_COMPILER=clang++); "
                    "fuzz_jinja is not built")
  endif()
endif()

# CLI checks of chat templates (tokenize --chat, pack) against the transformers fixtures.
add_test(NAME loaders_cli_chat
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cli_chat.sh $<TARGET_FILE:trainer_bin>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(loaders_cli_chat PROPERTIES LABELS "cpu;loaders" TIMEOUT 300)
