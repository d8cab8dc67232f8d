# The allocator benchmark replays a trace it recorded (smoke test of record + replay).
if(TARGET bench_allocator)
  add_test(NAME bench_allocator_record_replay
           COMMAND bash -c "$<TARGET_FILE:bench_allocator> --steps 2 --layers 2 --record ${CMAKE_CURRENT_BINARY_DIR}/alloc_trace.json >/dev/null && $<TARGET_FILE:bench_allocator> --trace ${CMAKE_CURRENT_BINARY_DIR}/alloc_trace.json | grep -q '\"allocations\"'")
  set_tests_properties(bench_allocator_record_replay PROPERTIES LABELS "cpu;engine")
endif()
