# Data-parallel SFT under mpirun (label mpi): data_parallel.sh compares it with the single-process
# run over the same global batch.
if(MPI_CXX_FOUND)
  find_program(LT_MPIRUN mpirun)
  set(_cases refusals accum_z0 accum_z2 accum_z3 resume_z0 resume_z1 resume_z2 resume_z3 resume_any dpo_z0 dpo_z1
      kto_z0 kto_z2 model_only_z2 best_z3
      eval_grpo eval_online_dpo
      lost_rank_KILL lost_rank_STOP online_grpo online_rloo online_online_dpo online_distill online_judge
      ds3_generation
      z3_offload z3_qlora tokens_z3 tokens_z3_tied)
  foreach(stage 0 1 2 3)
    foreach(kind full lora)
      foreach(np 1 2 4)
        list(APPEND _cases z${stage}_${kind}_np${np} ga2_z${stage}_${kind}_np${np})
      endforeach()
    endforeach()
  endforeach()
  foreach(c ${_cases})
    add_test(NAME dist_data_parallel_${c}
             COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/data_parallel.sh $<TARGET_FILE:trainer_bin>
                     ${LT_MPIRUN} ${c})
    set_tests_properties(dist_data_parallel_${c} PROPERTIES LABELS "mpi;dist" TIMEOUT 600
                         RESOURCE_LOCK mpi)
  endforeach()
endif()
