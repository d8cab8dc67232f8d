# trainer_bin sft --memory_trace and trainer_bin memviz (tests/cli/memviz.sh): the trace and
# the page from the command line, and the page in headless Chromium (skipped without it;
# scripts/setup.sh installs it). The screenshot and the page land in test_artifacts/.
foreach(mode cli chromium)
  add_test(NAME cli_memviz_${mode}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/memviz.sh $<TARGET_FILE:trainer_bin>
                   ${PROJECT_BINARY_DIR}/test_artifacts ${mode})
  set_tests_properties(cli_memviz_${mode} PROPERTIES LABELS "cpu;cli" TIMEOUT 300
                       SKIP_RETURN_CODE 77)
endforeach()
