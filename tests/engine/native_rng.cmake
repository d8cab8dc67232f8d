# Host/device RNG parity where the compiler may fuse a*b + c into FMAs: native_rng_parity.cpp is
# built with -march=native and the host RNG sources' flags (LT_HOST_RNG_FLAGS, root CMakeLists).
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-march=native LT_HAVE_MARCH_NATIVE)
if(LT_HAVE_MARCH_NATIVE)
  add_executable(engine_native_rng_parity ${CMAKE_CURRENT_LIST_DIR}/native_rng_parity.cpp)
  target_compile_options(engine_native_rng_parity PRIVATE -march=native ${LT_HOST_RNG_FLAGS})
  target_link_libraries(engine_native_rng_parity PRIVATE lt_testing GTest::gtest_main)
  gtest_discover_tests(engine_native_rng_parity WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
                       DISCOVERY_TIMEOUT 60 PROPERTIES LABELS engine TIMEOUT 300)
endif()
