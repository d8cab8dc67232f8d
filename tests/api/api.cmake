# The installed package (cmake/install.cmake) and the example project (examples/): install into
# a temporary prefix, build examples/ with find_package(leantune) and with pkg-config, run it.
# The API's own tests are api_test_api (tests/api/test_api.cpp).
add_test(NAME api_install_example
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/install_example.sh ${PROJECT_BINARY_DIR}
                 ${PROJECT_SOURCE_DIR} ${PROJECT_VERSION})
# It reads the build tree, which the layer probes rebuild: one at a time (RESOURCE_LOCK).
set_tests_properties(api_install_example PROPERTIES LABELS "cpu;api" TIMEOUT 600
                     RESOURCE_LOCK lt_build_tree)
target_compile_definitions(api_test_api PRIVATE LEANTUNE_TEST_VERSION="${PROJECT_VERSION}")
