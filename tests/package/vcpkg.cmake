# The vcpkg port (ports/qcoll) without vcpkg, which CI does not have: the portfile runs
# under vcpkg_portfile_runner.cmake (the vcpkg helpers it calls, done as vcpkg does
# them), the package passes the post-build checks that apply to it, and a project made
# of the usage file's lines builds against the installed tree and runs a collective.
# The tools feature is on, so that both of the portfile's branches run. What needs vcpkg
# itself (resolving the dependencies, its own post-build checks, its toolchain file) was
# done by hand when the port was written, with vcpkg 2026-07-27.
add_test(NAME package.vcpkg_port
  COMMAND ${CMAKE_COMMAND} "-DPORT_DIR=${PROJECT_SOURCE_DIR}/ports/qcoll" "-DBINARY_DIR=${package_dir}/vcpkg_port"
          "-DCOMPILER=${CMAKE_CXX_COMPILER}" "-DGENERATOR=${CMAKE_GENERATOR}" -DFEATURES=tools
          "-DCONSUMER=${CMAKE_CURRENT_LIST_DIR}/consumer.cpp"
          -P "${CMAKE_CURRENT_LIST_DIR}/vcpkg_portfile_runner.cmake")
set_tests_properties(package.vcpkg_port PROPERTIES LABELS package PROCESSORS 2)
