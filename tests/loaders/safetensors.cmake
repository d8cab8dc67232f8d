# safetensors beyond the plain test binary (loaders_test_safetensors, built by tests/CMakeLists):
#   - loaders_test_safetensors_asan: the same tests with the loader and engine sources compiled
#     into the executable under AddressSanitizer + UBSan (not linked against libleantune, so
#     every line involved is instrumented);
#   - fuzz_safetensors_corpus: drives tests/fuzz/fuzz_safetensors.cpp over the committed seed
#     corpus, so the fuzz entry point runs in every ctest run without clang;
#   - fuzz_safetensors: the libFuzzer target, with LEANTUNE_FUZZ=ON and clang only:
#       cmake -DLEANTUNE_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang ...
#   - loaders_inspect_cli: trainer_bin inspect on good and bad inputs (exit codes, stderr).

file(GLOB _lt_st_engine_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/engine/*.cpp)
set(_lt_st_sources
    ${PROJECT_SOURCE_DIR}/loaders/safetensors.cpp
    ${PROJECT_SOURCE_DIR}/loaders/fs_util.cpp
    ${_lt_st_engine_sources})

# What libleantune gives its users, for executables that compile the sources themselves.
function(_lt_st_standalone tgt)
  target_include_directories(${tgt} PRIVATE ${PROJECT_SOURCE_DIR} ${UTF8PROC_INCLUDE}
                             ${CLI11_INCLUDE} ${CBLAS_INCLUDE})
  target_link_libraries(${tgt} PRIVATE OpenMP::OpenMP_CXX nlohmann_json::nlohmann_json fmt::fmt
                        PkgConfig::PCRE2 ${UTF8PROC_LIB} ${BLAS_LIBRARIES} Threads::Threads)
  if(MPI_CXX_FOUND)
    target_link_libraries(${tgt} PRIVATE MPI::MPI_CXX)
    target_compile_definitions(${tgt} PRIVATE LEANTUNE_WITH_MPI=1)
  endif()
endfunction()

set(_lt_st_san -fsanitize=address,undefined -fno-omit-frame-pointer
    -fno-sanitize-recover=undefined)
add_executable(loaders_test_safetensors_asan
               ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.cpp ${_lt_st_sources})
_lt_st_standalone(loaders_test_safetensors_asan)
target_compile_options(loaders_test_safetensors_asan PRIVATE ${_lt_st_san})
target_link_options(loaders_test_safetensors_asan PRIVATE -fsanitize=address,undefined)
target_link_libraries(loaders_test_safetensors_asan PRIVATE GTest::gtest_main)
add_test(NAME loaders_test_safetensors_asan COMMAND loaders_test_safetensors_asan
         WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(loaders_test_safetensors_asan PROPERTIES
  LABELS "cpu;loaders;sanitize" TIMEOUT 900
  ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

set(_lt_st_fuzz_src ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_safetensors.cpp)
add_executable(fuzz_safetensors_corpus ${_lt_st_fuzz_src})
target_link_libraries(fuzz_safetensors_corpus PRIVATE leantune)
add_test(NAME fuzz_safetensors_corpus
         COMMAND fuzz_safetensors_corpus ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/safetensors)
set_tests_properties(fuzz_safetensors_corpus PROPERTIES LABELS "cpu;loaders;fuzz" TIMEOUT 300)

if(LEANTUNE_FUZZ)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    add_executable(fuzz_safetensors ${_lt_st_fuzz_src} ${_lt_st_sources})
    _lt_st_standalone(fuzz_safetensors)
    target_compile_definitions(fuzz_safetensors PRIVATE LEANTUNE_LIBFUZZER=1)
    target_compile_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined
                           -fno-omit-frame-pointer)
    target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
  else()
    message(WARNING "LEANTUNE_FUZZ needs clang (-DCMAKE_CXX_COMPILER=clang++); "
                    "fuzz_safetensors is not built")
  endif()
endif()

add_test(NAME loaders_inspect_cli
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/inspect_cli.sh $<TARGET_FILE:trainer_bin>
                 ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/inspect_cli_work)
set_tests_properties(loaders_inspect_cli PROPERTIES LABELS "cpu;loaders" TIMEOUT 120)
