# The cross-backend op table: tests/CMakeLists.txt builds backend_test_ops from test_ops.cpp (the
# runner); the harness and the table files join it here. GPU-tier entries are
# Ops/BackendOpsCuda.MatchesCpu/<entry> (label gpu), their CPU self-checks
# Ops/BackendOpsSelfCheck.CpuAgainstCpu/<entry> (label backend).
set(_lt_backend_dir ${CMAKE_CURRENT_LIST_DIR})
target_sources(backend_test_ops PRIVATE
  ${_lt_backend_dir}/harness.cpp
  ${_lt_backend_dir}/naive.cpp
  ${_lt_backend_dir}/table_engine.cpp
  ${_lt_backend_dir}/table_optim.cpp
  ${_lt_backend_dir}/table_layers.cpp
  ${_lt_backend_dir}/table_linear.cpp
  ${_lt_backend_dir}/table_losses.cpp
  ${_lt_backend_dir}/table_attention.cpp
  ${_lt_backend_dir}/table_ring.cpp)
