# Zigzag ring attention under mpirun with context-parallel sizes 1, 2 and 4 (label mpi).
if(MPI_CXX_FOUND)
  find_program(LT_MPIRUN mpirun)
  add_executable(kernels_ring_attention_mpi ${CMAKE_CURRENT_LIST_DIR}/ring_attention_mpi_main.cpp)
  target_link_libraries(kernels_ring_attention_mpi PRIVATE lt_testing GTest::gtest)
  foreach(np 1 2 4)
    add_test(NAME kernels_ring_attention_mpi_np${np}
             COMMAND ${LT_MPIRUN} --oversubscribe --allow-run-as-root --bind-to none
                     -x OMP_NUM_THREADS=1 -np ${np} $<TARGET_FILE:kernels_ring_attention_mpi>)
    set_tests_properties(kernels_ring_attention_mpi_np${np} PROPERTIES LABELS "mpi;kernels"
                         TIMEOUT 300 RESOURCE_LOCK mpi
                         ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
  endforeach()
endif()
