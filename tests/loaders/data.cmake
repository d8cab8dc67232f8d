# CLI tests of the data tools (`trainer_bin pack`, `trainer_bin lengths`): exit codes, one-line
# error messages naming file and line, and the files they write. Included by tests/CMakeLists.txt.
add_test(NAME loaders_cli_data
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cli_data.sh $<TARGET_FILE:trainer_bin>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(loaders_cli_data PROPERTIES LABELS "cpu;loaders" TIMEOUT 300)
