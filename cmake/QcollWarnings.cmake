# Warnings for qcoll's own targets (tests, examples, benchmarks); never global flags.
function(qcoll_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${QCOLL_WARNINGS_AS_ERRORS}>>:-Werror>)
endfunction()
