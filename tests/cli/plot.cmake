# trainer_bin plot on a short sft run, the page checked in headless Chromium (tests/cli/plot.sh).
add_test(NAME cli_plot_chromium
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/plot.sh $<TARGET_FILE:trainer_bin>
                 ${PROJECT_BINARY_DIR}/test_artifacts)
set_tests_properties(cli_plot_chromium PROPERTIES LABELS "cpu;cli" TIMEOUT 300
                     SKIP_RETURN_CODE 77)
