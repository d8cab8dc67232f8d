# cuDNN attention must also build without the cuDNN frontend's headers (kernels/attention_cudnn.cu
# then reports "not built" and attention runs on leantune's own kernels), whether or not this build
# found them. The probe compiles the file as the kernels layer without LEANTUNE_WITH_CUDNN_FRONTEND
# (the top-level file's source properties, which add it, do not reach this directory), for one
# architecture; ctest builds it.
if(LEANTUNE_CUDA)
  add_library(lt_probe_attention_cudnn_off OBJECT EXCLUDE_FROM_ALL
              ${PROJECT_SOURCE_DIR}/kernels/attention_cudnn.cu)
  lt_layer_target(lt_probe_attention_cudnn_off kernels)
  set_target_properties(lt_probe_attention_cudnn_off PROPERTIES CUDA_ARCHITECTURES 90-real)
  add_test(NAME build_attention_cudnn_without_frontend
           COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR}
                   --target lt_probe_attention_cudnn_off)
  set_tests_properties(build_attention_cudnn_without_frontend PROPERTIES
    LABELS "cpu;layers" TIMEOUT 300 RESOURCE_LOCK lt_build_tree)
endif()
