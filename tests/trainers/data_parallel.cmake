# Data-parallel SFT under mpirun (label mpi): data_parallel.sh compares it with the single-process
# run over the same global batch.
if(MPI_CXX_FOUND)
  find_program(LT_MPIRUN mpirun)
  foreach(c full_np2 full_np4 lora_np2 lora_np4 accum refusals)
    add_test(NAME trainers_data_parallel_${c}
             COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/data_parallel.sh $<TARGET_FILE:trainer_bin>
                     ${LT_MPIRUN} ${c})
    set_tests_properties(trainers_data_parallel_${c} PROPERTIES LABELS "mpi;trainers" TIMEOUT 600)
  endforeach()
endif()
