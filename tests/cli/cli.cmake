# trainer_bin's command line: invalid options exit 2 with one line, --help, init-model then generate
add_test(NAME cli_trainers COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cli_trainers.sh
         $<TARGET_FILE:trainer_bin> ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_trainers PROPERTIES LABELS cli TIMEOUT 300)
# Hub IDs resolved offline in a Hugging Face cache folder (tests/cli/hub_cache.sh)
add_test(NAME cli_hub_cache COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/hub_cache.sh
         $<TARGET_FILE:trainer_bin> ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_hub_cache PROPERTIES LABELS cli TIMEOUT 300)
