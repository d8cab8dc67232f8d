# trainer_bin lengths --plot, its SVG checked in headless Chromium (tests/cli/lengths_plot.sh).
add_test(NAME cli_lengths_plot_chromium
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/lengths_plot.sh $<TARGET_FILE:trainer_bin>
                 ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/test_artifacts)
set_tests_properties(cli_lengths_plot_chromium PROPERTIES LABELS "cpu;cli" TIMEOUT 300
                     SKIP_RETURN_CODE 77)
