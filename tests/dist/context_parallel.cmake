# Context-parallel SFT, DPO and KTO under mpirun (label mpi): context_parallel.sh compares the loss
# curve of cp ranks (zigzag ring attention) with the single-process run over the same global batch.
if(MPI_CXX_FOUND)
  find_program(LT_MPIRUN mpirun)
  foreach(c cp2 cp4 dp2_cp2 cp2_checkpointing cp2_packing dp2_cp2_zero2 dp2_cp2_zero3 cp2_qlora
          cp2_eval cp2_lora_offload activation_memory resume refusals dpo_cp2 dpo_dp2_cp2 kto_cp2
          kto_dp2_cp2)
    add_test(NAME dist_context_parallel_${c}
             COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/context_parallel.sh $<TARGET_FILE:trainer_bin>
                     ${LT_MPIRUN} ${PROJECT_SOURCE_DIR} ${c})
    set_tests_properties(dist_context_parallel_${c} PROPERTIES LABELS "mpi;dist"
                         TIMEOUT 600 RESOURCE_LOCK mpi)
  endforeach()
endif()
add_test(NAME dist_context_parallel_estimate
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/context_parallel.sh $<TARGET_FILE:trainer_bin> none
                 ${PROJECT_SOURCE_DIR} estimate)
set_tests_properties(dist_context_parallel_estimate PROPERTIES LABELS dist TIMEOUT 300)
