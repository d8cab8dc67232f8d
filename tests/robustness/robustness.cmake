# The robustness tier (ctest label `robustness`), included by tests/CMakeLists.txt:
#   - robustness_cases: trainer_bin over the table of bad inputs, faults and signals in
#     cases.tsv (run_cases.sh); robustness_<area>: the same over cases_<area>.tsv (and its
#     setups in cases_<area>.sh), one table per area so that each stays within its timeout;
#   - robustness_ulimit: the demo under ulimit -v from 700 MB to 1.3 GB exits 0 or 3, never hangs;
#   - robustness_kill_resume: SIGKILLs at random moments of small runs (full fine-tuning, and
#     LoRA with dropout for sft, dpo and reward; several during saves), resumed each time, must end
#     bit-identical to the straight run; its disk-full variant needs root and a tmpfs mount and
#     reports SKIPPED elsewhere;
#   - robustness_term_resume: the same with SIGTERMs, which land between micro-batches, in
#     generation phases and in reward-command waits (sft, kto and grpo with LoRA).
add_test(NAME robustness_cases COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run_cases.sh
         $<TARGET_FILE:trainer_bin> ${PROJECT_SOURCE_DIR})
set_tests_properties(robustness_cases PROPERTIES LABELS "cpu;robustness" TIMEOUT 300)
foreach(area io data signals children bounds)
  add_test(NAME robustness_${area} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run_cases.sh
           $<TARGET_FILE:trainer_bin> ${PROJECT_SOURCE_DIR} cases_${area}.tsv)
  set_tests_properties(robustness_${area} PROPERTIES LABELS "cpu;robustness" TIMEOUT 300)
endforeach()
add_test(NAME robustness_kill_resume COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/kill_resume.sh
         $<TARGET_FILE:trainer_bin> ${PROJECT_SOURCE_DIR})
set_tests_properties(robustness_kill_resume PROPERTIES LABELS "cpu;robustness" TIMEOUT 300)
add_test(NAME robustness_term_resume COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/kill_resume.sh
         $<TARGET_FILE:trainer_bin> ${PROJECT_SOURCE_DIR} term)
set_tests_properties(robustness_term_resume PROPERTIES LABELS "cpu;robustness" TIMEOUT 300)
add_test(NAME robustness_kill_resume_disk_full
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/kill_resume.sh $<TARGET_FILE:trainer_bin>
                 ${PROJECT_SOURCE_DIR} disk_full)
set_tests_properties(robustness_kill_resume_disk_full PROPERTIES LABELS "cpu;robustness"
                     TIMEOUT 300 SKIP_RETURN_CODE 77)
add_test(NAME robustness_ulimit COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ulimit.sh
         $<TARGET_FILE:trainer_bin>)
set_tests_properties(robustness_ulimit PROPERTIES LABELS "cpu;robustness" TIMEOUT 400)
