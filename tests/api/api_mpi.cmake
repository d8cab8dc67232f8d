# An embedder's MPI communicator (TrainerSetup::communicator) under mpirun (label mpi), for sft
# and dpo: two halves of a 4-rank job train at once, each equal to a plain 2-rank run
# (api_mpi.sh).
if(MPI_CXX_FOUND)
  find_program(LT_MPIRUN mpirun)
  add_executable(api_mpi_main ${CMAKE_CURRENT_LIST_DIR}/api_mpi_main.cpp)
  target_link_libraries(api_mpi_main PRIVATE leantune MPI::MPI_CXX)
  add_test(NAME api_mpi_communicator
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/api_mpi.sh $<TARGET_FILE:api_mpi_main>
                   ${LT_MPIRUN})
  set_tests_properties(api_mpi_communicator PROPERTIES LABELS "mpi;api" TIMEOUT 120
                       RESOURCE_LOCK mpi ENVIRONMENT "OMP_NUM_THREADS=1")
endif()
