# A build without CMake, exactly as the README's "Without CMake" command does it: the
# command is read from the README, so the documented flags are the tested ones. Each
# PROGRAMS entry is compiled with it and run.
#   cmake -DREADME=… -DSOURCE_DIR=<qcoll> -DCOMPILER=… -DBINARY_DIR=… -DPROGRAMS='a.cpp|b.cpp' -P header_only.cmake
file(STRINGS "${README}" commands REGEX "^g\\+\\+-12 .* app\\.cpp")
list(LENGTH commands count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "README.md should have one 'g++-12 … app.cpp' command line (the build without CMake), has ${count}")
endif()
separate_arguments(documented UNIX_COMMAND "${commands}")
file(MAKE_DIRECTORY "${BINARY_DIR}")

string(REPLACE "|" ";" programs "${PROGRAMS}")
foreach(program IN LISTS programs)
  get_filename_component(name "${program}" NAME_WE)
  # The README's words for the compiler, the include path and the user's source
  # become this build's compiler and paths; every flag stays as documented.
  set(command ${documented})
  list(TRANSFORM command REPLACE "^g\\+\\+-12$" "${COMPILER}")
  list(TRANSFORM command REPLACE "^qcoll/include$" "${SOURCE_DIR}/include")
  list(TRANSFORM command REPLACE "^app\\.cpp$" "${program}")
  list(APPEND command -o "${BINARY_DIR}/${name}")
  execute_process(COMMAND ${command} RESULT_VARIABLE status ERROR_VARIABLE errors)
  if(NOT status EQUAL 0)
    list(JOIN command " " shown)
    message(FATAL_ERROR "the README's build without CMake failed (${status}):\n${shown}\n${errors}")
  endif()
  execute_process(COMMAND "${BINARY_DIR}/${name}" RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  # Checked before the output is printed: the test passes on what the programs print.
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${name}, built without CMake, exited with ${status}:\n${output}")
  endif()
  message(STATUS "${name}: ${output}")
endforeach()
