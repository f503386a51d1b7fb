# Issue 30 item 5: impl/src/ and reference/src/ mirror each other file by
# file, grouped as the public headers are. Fails, naming the files, when
#  - a file of impl/src/nn/ or impl/src/mpi/ has no twin at the same relative
#    path under reference/src/ (and is not one of the few listed below that
#    have nothing to emulate);
#  - a file of reference/src/nn/, mpi/ or smp/ has no twin under impl/src/;
#  - a public header partita/nn/X.hpp has no impl/src/nn/X.cpp (one file per
#    primitive and layer: ReduceScatter is not inside all_gather.cpp), but
#    functional.hpp and traffic.hpp, which declare no primitive or layer.
# impl/src/smp/ is only checked from the reference's side: seed 004's API has
# no serial twin under reference/src/smp/ yet.
# Usage: cmake -DSOURCE_DIR=<repository> -P check_mirror.cmake
cmake_minimum_required(VERSION 3.20)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "give -DSOURCE_DIR=<the repository>")
endif()
set(impl ${SOURCE_DIR}/impl/src)
set(ref ${SOURCE_DIR}/reference/src)

# impl files with no serial twin, and why: the reference runs one process
# and moves no bytes.
set(no_twin
  mpi/runtime.cpp       # MPI's environment and the waiting policy
  mpi/peer_check.cpp    # the lost-node probes between ranks' hosts
  mpi/peer_check.hpp
  mpi/buffer_cache.cpp  # MPI's reusable message buffers
  mpi/env_number.hpp    # the runtime's and the cache's numbers from the environment
  mpi/tensor_data.cpp   # tensors over Partition's byte transport (the reference's
                        # partition.cpp emulates the bytes themselves)
)

set(problems "")
set(checked 0)
foreach(group nn mpi)
  file(GLOB files RELATIVE ${impl} ${impl}/${group}/*.cpp ${impl}/${group}/*.hpp)
  foreach(f IN LISTS files)
    math(EXPR checked "${checked} + 1")
    if(f IN_LIST no_twin)
      if(EXISTS ${ref}/${f})
        list(APPEND problems "impl/src/${f} is listed as having no twin, but reference/src/${f} exists: drop it from the list")
      endif()
    elseif(NOT EXISTS ${ref}/${f})
      list(APPEND problems "impl/src/${f} has no twin reference/src/${f}")
    endif()
  endforeach()
endforeach()
foreach(f IN LISTS no_twin)
  if(NOT EXISTS ${impl}/${f})
    list(APPEND problems "impl/src/${f} is listed as having no twin but does not exist: drop it from the list")
  endif()
endforeach()

foreach(group nn mpi smp)
  file(GLOB files RELATIVE ${ref} ${ref}/${group}/*.cpp ${ref}/${group}/*.hpp)
  foreach(f IN LISTS files)
    math(EXPR checked "${checked} + 1")
    if(NOT EXISTS ${impl}/${f})
      list(APPEND problems "reference/src/${f} has no twin impl/src/${f}")
    endif()
  endforeach()
endforeach()

file(GLOB headers RELATIVE ${SOURCE_DIR}/impl/include/partita/nn
     ${SOURCE_DIR}/impl/include/partita/nn/*.hpp)
list(REMOVE_ITEM headers functional.hpp)  # the functional forms of every primitive
list(REMOVE_ITEM headers traffic.hpp)  # the Linear layers' byte counters, kept in linear.cpp (no layer)
foreach(h IN LISTS headers)
  math(EXPR checked "${checked} + 1")
  string(REGEX REPLACE "\\.hpp$" ".cpp" f "${h}")
  if(NOT EXISTS ${impl}/nn/${f})
    list(APPEND problems "partita/nn/${h} has no impl/src/nn/${f}")
  endif()
endforeach()

if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "impl/src and reference/src do not mirror each other:\n  ${text}")
endif()
if(checked LESS 10)
  message(FATAL_ERROR "found only ${checked} files to check under ${SOURCE_DIR}: the check would prove nothing")
endif()
message(STATUS "impl/src and reference/src mirror each other (${checked} files and headers checked)")
