# `cmake --install` layout, for pipelines that link leantune (docs/embedding.md):
#   include/leantune/leantune.h            the public API (the only installed header)
#   lib/libleantune.so.MAJOR(.MINOR.PATCH) the library, its soname carrying the ABI major
#   lib/libleantune_cuda.so                the CUDA backend, found beside libleantune (CUDA builds)
#   lib/cmake/leantune/                    leantuneConfig.cmake: find_package(leantune CONFIG)
#                                          gives leantune::leantune
#   lib/pkgconfig/leantune.pc              pkg-config --cflags --libs leantune
#   share/leantune/embedded/               the embedded demo's model config, tokenizer, data
#   bin/trainer_bin
# The public header needs C++17 and nothing else, so the package has no dependencies to find;
# libleantune's own shared-library dependencies are resolved by the dynamic loader (its RUNPATH
# keeps non-system folders such as OpenBLAS's openmp variant).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

target_include_directories(leantune INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(leantune INTERFACE cxx_std_17)
set_target_properties(leantune PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
set_target_properties(trainer_bin PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}"
                      INSTALL_RPATH_USE_LINK_PATH TRUE)

install(TARGETS leantune EXPORT leantuneTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS trainer_bin RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET leantune_cuda)
  set_target_properties(leantune_cuda PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
  install(TARGETS leantune_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(FILES ${PROJECT_SOURCE_DIR}/include/leantune/leantune.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/leantune)
install(FILES ${PROJECT_SOURCE_DIR}/data/embedded/config.json
              ${PROJECT_SOURCE_DIR}/data/embedded/stories.jsonl
              ${PROJECT_SOURCE_DIR}/data/embedded/preferences.jsonl
              ${PROJECT_SOURCE_DIR}/data/embedded/unpaired.jsonl
              ${PROJECT_SOURCE_DIR}/data/embedded/tokenizer.json
              ${PROJECT_SOURCE_DIR}/data/embedded/tokenizer_config.json
              ${PROJECT_SOURCE_DIR}/data/embedded/VERSIONS.json
        DESTINATION ${CMAKE_INSTALL_DATADIR}/leantune/embedded)

set(_lt_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/leantune)
install(EXPORT leantuneTargets NAMESPACE leantune:: DESTINATION ${_lt_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/leantuneConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/leantuneConfig.cmake
                              INSTALL_DESTINATION ${_lt_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/leantuneConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/leantuneConfig.cmake
              ${PROJECT_BINARY_DIR}/leantuneConfigVersion.cmake
        DESTINATION ${_lt_cmake_dir})

configure_file(${CMAKE_CURRENT_LIST_DIR}/leantune.pc.in ${PROJECT_BINARY_DIR}/leantune.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/leantune.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
