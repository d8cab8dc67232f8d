# trainer_bin sft/dpo --profile_steps on the embedded demo (tests/trainers/profile.sh): the
# per-op table and profile.json, CPU timers.
add_test(NAME trainers_profile_steps
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/profile.sh $<TARGET_FILE:trainer_bin>)
set_tests_properties(trainers_profile_steps PROPERTIES LABELS "cpu;trainers" TIMEOUT 300)
