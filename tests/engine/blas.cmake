# The choice of OpenBLAS kernels (engine/blas_kernels.h), end to end through trainer_bin
# (blas_kernels.sh), and the losses and gradients of the transformers/TRL fixtures under each
# kernel family this CPU runs: a family forced with OPENBLAS_CORETYPE must give the fixtures'
# values within their own tolerances (skipped for a family the CPU cannot run).
add_test(NAME engine_blas_kernels_cli
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/blas_kernels.sh cli $<TARGET_FILE:trainer_bin>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(engine_blas_kernels_cli PROPERTIES LABELS "cpu;engine" TIMEOUT 300
                     SKIP_RETURN_CODE 77)
if(MPI_CXX_FOUND)
  find_program(LT_MPIRUN mpirun)
  add_test(NAME engine_blas_kernels_mpi
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/blas_kernels.sh mpi $<TARGET_FILE:trainer_bin>
                   ${PROJECT_SOURCE_DIR} ${LT_MPIRUN})
  set_tests_properties(engine_blas_kernels_mpi PROPERTIES LABELS "mpi;engine" TIMEOUT 300
                       RESOURCE_LOCK mpi SKIP_RETURN_CODE 77)
endif()
# An embedding host, which the library cannot restart, is warned once under a simulated
# Prescott detection.
add_test(NAME engine_blas_kernels_embedder_warning
         COMMAND env OPENBLAS_CORETYPE=Prescott LEANTUNE_BLAS_SIMULATE_DETECTED=Prescott
                 $<TARGET_FILE:engine_test_blas_kernels> --gtest_filter=*LibraryWarnsOnce*)
set_tests_properties(engine_blas_kernels_embedder_warning PROPERTIES LABELS "cpu;engine")
# Each family: the report names the forced family (so the variable took effect), then the
# fixtures of the model (logits, loss, every gradient), DPO and the reward trainer.
foreach(family Prescott Sandybridge Haswell Zen SkylakeX Cooperlake)
  add_test(NAME engine_blas_kernels_fixtures_${family}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/blas_kernels.sh family ${family}
                   $<TARGET_FILE:engine_test_blas_kernels> *ReportNames*
                   $<TARGET_FILE:models_test_hf_parity> *LogitsAndLoss*:*EveryParameterGradient*
                   $<TARGET_FILE:trainers_test_dpo> *DpoParity*
                   $<TARGET_FILE:trainers_test_reward> *RewardParity*
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(engine_blas_kernels_fixtures_${family} PROPERTIES LABELS "cpu;engine"
                       TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
