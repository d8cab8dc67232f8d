# The layer include roots (top-level CMakeLists.txt, lt_layer_target) turn an upward include into
# a build error. Two probes compiled as the loaders layer prove it, each built by ctest:
#   - layers_upward_include_fails: loaders code including models/decoder.h must fail to build
#     with "No such file" (any other outcome fails the test);
#   - layers_downward_include_builds: loaders code including engine/ and loaders/ headers builds,
#     so the first probe fails for the right reason.
# The probes share the build tree, so they run one at a time (RESOURCE_LOCK).
foreach(probe upward downward)
  add_library(lt_layer_probe_${probe} OBJECT EXCLUDE_FROM_ALL
              ${CMAKE_CURRENT_LIST_DIR}/probe_${probe}_include.cpp)
  lt_layer_target(lt_layer_probe_${probe} loaders)
endforeach()

add_test(NAME layers_upward_include_fails
         COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target lt_layer_probe_upward)
set_tests_properties(layers_upward_include_fails PROPERTIES
  LABELS "cpu;layers" TIMEOUT 300 RESOURCE_LOCK lt_build_tree
  PASS_REGULAR_EXPRESSION "models/decoder\\.h'?:? (No such file or directory|file not found)")

add_test(NAME layers_downward_include_builds
         COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target lt_layer_probe_downward)
set_tests_properties(layers_downward_include_builds PROPERTIES
  LABELS "cpu;layers" TIMEOUT 300 RESOURCE_LOCK lt_build_tree)

# The same order at link time: each layer's objects are linked into a shared library against
# the layers below it only, with every symbol resolved (--no-undefined), so a call into a higher
# layer fails layers_link_downward_only. Not with sanitizers (their runtime is left undefined).
if(NOT LEANTUNE_SANITIZE)
  set(_lt_link_below "")
  foreach(layer ${LT_LAYERS})
    add_library(lt_layer_link_${layer} SHARED EXCLUDE_FROM_ALL
                $<TARGET_OBJECTS:leantune_${layer}>)
    target_link_libraries(lt_layer_link_${layer} PUBLIC leantune_deps ${_lt_link_below}
                          PRIVATE ${CMAKE_DL_LIBS})
    target_link_options(lt_layer_link_${layer} PRIVATE -Wl,--no-undefined)
    set(_lt_link_below lt_layer_link_${layer})
  endforeach()
  add_test(NAME layers_link_downward_only
           COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target lt_layer_link_cli)
  set_tests_properties(layers_link_downward_only PROPERTIES
    LABELS "cpu;layers" TIMEOUT 600 RESOURCE_LOCK lt_build_tree)
endif()
