add_test(NAME trainers_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/trainers/cli_trainers.sh
         $<TARGET_FILE:trainer_bin> ${PROJECT_SOURCE_DIR})
set_tests_properties(trainers_cli PROPERTIES LABELS trainers TIMEOUT 300)
