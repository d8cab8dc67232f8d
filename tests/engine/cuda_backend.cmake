# The lazily loaded CUDA backend from the command line (tests/engine/cuda_backend.sh); the
# library side is engine_test_cuda_backend.
add_test(NAME engine_cuda_backend_cli
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cuda_backend.sh $<TARGET_FILE:trainer_bin>
                 ${PROJECT_SOURCE_DIR} $<$<BOOL:${LEANTUNE_SANITIZE}>:sanitize>)
set_tests_properties(engine_cuda_backend_cli PROPERTIES LABELS "cpu;engine" TIMEOUT 300)
