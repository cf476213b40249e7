# The README shows examples/quickstart.cpp verbatim, so the example in the docs compiles and runs.
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "${example}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not contain ${EXAMPLE} verbatim: update the README's usage example")
endif()
