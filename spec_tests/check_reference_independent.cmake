# Issue 9: the reference must not call the MPI implementation's statement of
# the rules and tilings (common/src/rules.cpp, tiling.cpp). Fails if the
# reference library needs any symbol those files define, or any of the
# shared index arithmetic the implementation places its pieces with
# (common/src/shape.cpp's balanced split and row-major (un)ravelling): the
# reference counts those itself.
execute_process(COMMAND ${NM} -C --defined-only ${PLAN} OUTPUT_VARIABLE plan_syms RESULT_VARIABLE r1)
execute_process(COMMAND ${NM} -C --undefined-only ${REFERENCE} OUTPUT_VARIABLE needed RESULT_VARIABLE r2)
if(r1 OR r2)
  message(FATAL_ERROR "nm failed on ${PLAN} or ${REFERENCE}")
endif()
string(REGEX MATCHALL " T partita::[A-Za-z_:]+\\(" defined "${plan_syms}")
list(LENGTH defined n)
if(n EQUAL 0)
  message(FATAL_ERROR "found no functions in ${PLAN}: the check would prove nothing")
endif()
list(APPEND defined " T partita::local_length(" " T partita::local_start(" " T partita::unravel("
                    " T partita::ravel(")
set(shared "")
foreach(d IN LISTS defined)
  string(REGEX REPLACE "^ T " "" name "${d}")
  string(FIND "${needed}" "${name}" at)
  if(NOT at EQUAL -1)
    list(APPEND shared "${name}")
  endif()
endforeach()
if(shared)
  message(FATAL_ERROR "the reference calls the implementation's rules/tilings: ${shared}")
endif()
message(STATUS "the reference needs none of the ${n} functions of ${PLAN}")
