# Communicator tests. test_comm.cpp (single process) is discovered like every test_*.cpp; the MPI
# program runs under mpirun with 1, 2 and 4 ranks (label mpi), plus the failure cases: a stuck and
# a killed rank must end the job non-zero within seconds, naming the lost rank.
if(MPI_CXX_FOUND)
  find_program(LT_MPIRUN mpirun)
  add_executable(engine_comm_mpi ${CMAKE_CURRENT_LIST_DIR}/comm_mpi_main.cpp)
  target_link_libraries(engine_comm_mpi PRIVATE lt_testing GTest::gtest)
  set(LT_MPIRUN_ARGS --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)
  foreach(np 1 2 4)
    add_test(NAME engine_comm_mpi_np${np}
             COMMAND ${LT_MPIRUN} ${LT_MPIRUN_ARGS} -np ${np} $<TARGET_FILE:engine_comm_mpi>
                     collectives --gtest_brief=1 --gtest_filter=-*Cuda*)
    set_tests_properties(engine_comm_mpi_np${np} PROPERTIES LABELS "mpi;engine" TIMEOUT 300 RESOURCE_LOCK mpi
                         ENVIRONMENT "OMP_NUM_THREADS=1")
  endforeach()
  # The NCCL backend against the MPI one: gpu tier (skips without one GPU per rank).
  add_test(NAME engine_comm_nccl_cuda_np2
           COMMAND ${LT_MPIRUN} ${LT_MPIRUN_ARGS} -np 2 $<TARGET_FILE:engine_comm_mpi>
                   collectives --gtest_brief=1 --gtest_filter=*Cuda*)
  set_tests_properties(engine_comm_nccl_cuda_np2 PROPERTIES LABELS "gpu;mpi" TIMEOUT 300
                       RESOURCE_LOCK mpi SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  foreach(mode stuck killed)
    add_test(NAME engine_comm_mpi_${mode}_rank
             COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/comm_failure.sh ${mode} ${LT_MPIRUN}
                     $<TARGET_FILE:engine_comm_mpi>)
    set_tests_properties(engine_comm_mpi_${mode}_rank PROPERTIES LABELS "mpi;engine" TIMEOUT 120
                         RESOURCE_LOCK mpi)
  endforeach()
endif()
