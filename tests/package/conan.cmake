# The Conan package (conanfile.py): `conan create` from this checkout, then a consumer
# (test_package's program), a 4-rank allreduce and a one_bit round trip through the
# kernels the package's build module compiles in the consumer's build. Conan 2 comes from PyPI
# (tools/python-tools); CONAN_HOME and the test_package build lie in this build tree.
# Conan Center is out of reach, so boost, fmt and xsimd are Debian's, either as
# [platform_requires] (conan/debian12: the system's CMake configs) or through stand-ins
# declaring what Center's recipes declare (conan/center-stubs: CMakeDeps' configs).
set(qcoll_conan_pass
  "qcoll [0-9.]+ test_package: allreduce of [0-9]+ floats over 4 ranks: ok; one_bit encode/decode: ok on [a-z0-9]+ \\(run-time dispatch; built avx512f avx2 sse2 reference,")
# package.conan: README's offline commands as written (Debian's packages), then the
# consumer project README describes, run; package.conan_center_stubs: conan create.
add_test(NAME package.conan
  COMMAND "${CMAKE_CURRENT_LIST_DIR}/conan/readme.sh" "${CMAKE_CURRENT_BINARY_DIR}/package/conan")
set_tests_properties(package.conan PROPERTIES
  PASS_REGULAR_EXPRESSION "package.conan: README's commands built a project that says: ${qcoll_conan_pass}")
add_test(NAME package.conan_center_stubs
  COMMAND "${CMAKE_CURRENT_LIST_DIR}/conan/create.sh" "${CMAKE_CURRENT_BINARY_DIR}/package/conan_center_stubs"
          --center-stubs)
set_tests_properties(package.conan_center_stubs PROPERTIES PASS_REGULAR_EXPRESSION "${qcoll_conan_pass}")
set_tests_properties(package.conan package.conan_center_stubs PROPERTIES
  LABELS package
  # Both results right, and the kernels built for each x86 instruction set and picked at run time.
  # PASS_REGULAR_EXPRESSION makes CTest ignore the exit status: fail on the script's and Conan's errors.
  FAIL_REGULAR_EXPRESSION "package.conan FAILED|ERROR: ")
unset(qcoll_conan_pass)
