# Shared by the death tests' judges (run_death.cmake, run_lost_node.cmake,
# run_one_sided.cmake).
#
# death_check_survivors(MISSING RANK...): every RANK reached the operation
# ("rank R waits in MODE" in ${all}) and none returned from it ("rank R
# finished MODE"); MISSING names who never joined, for the message.
# Appends to ${problems}.
macro(death_check_survivors missing)
  foreach(r ${ARGN})
    if(NOT all MATCHES "rank ${r} waits in ${MODE}")
      string(APPEND problems "rank ${r} never reached the operation; ")
    endif()
    if(all MATCHES "rank ${r} finished ${MODE}")
      string(APPEND problems "rank ${r} returned from an operation ${missing} never joined; ")
    endif()
  endforeach()
endmacro()

# death_verdict(): fails with ${problems} and ${report}, or prints ${report}.
macro(death_verdict)
  if(problems)
    message(FATAL_ERROR "${problems}\n${report}")
  endif()
  message(STATUS "${report}")
endmacro()
