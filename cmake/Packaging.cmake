# `cmake --install` and CPack: the kvdiff binary, the engine plugin header and a CMake package, so
# that a C++ engine project gates its cache with
#   find_package(kvdiff REQUIRED)
#   kvdiff_add_check(NAME cache MODEL path/to/model BACKENDS plugin:... CASES 200 SHARDS 4)
# (cmake/kvdiffConfig.cmake.in). `cpack` in the build folder writes a .deb of the same files.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS kvdiff RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET kvdiff_reference_module)
  # LibTorch's reference, loaded by kvdiff when a ref backend is first built; it looks for it
  # here, relative to its own executable (harness/backend/reference_backend.cc).
  install(TARGETS kvdiff_reference_module LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/kvdiff)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/include/kvdiff/engine.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvdiff)

set(KVDIFF_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvdiff)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvdiffConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvdiffConfig.cmake
  INSTALL_DESTINATION ${KVDIFF_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_BINDIR CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvdiffConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvdiffConfig.cmake ${PROJECT_BINARY_DIR}/kvdiffConfigVersion.cmake
        DESTINATION ${KVDIFF_CMAKE_DIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvdiff)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Differential tester of KV-cache inference for Llama models, with a CMake package for ctest")
set(CPACK_PACKAGE_CONTACT "kvdiff maintainers <kvdiff@users.noreply.github.com>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# The shared libraries the binary and the reference module link (LibTorch, fmt, OpenBLAS through
# libblas.so.3, ...) become the package's Depends, read by dpkg-shlibdeps.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS libopenblas0-pthread)  # a fast libblas.so.3 for ref
include(CPack)
