# The MPIs qcoll's own tests, example and benchmark build against, found through
# pkg-config once for the whole build: PkgConfig::QCOLL_OPENMPI (Open MPI's ompi-c) and
# PkgConfig::QCOLL_MPICH, each a GLOBAL imported target where found. A project using
# transports/mpi.hpp links its own MPI instead (find_package(MPI), MPI::MPI_C).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(QCOLL_OPENMPI QUIET IMPORTED_TARGET GLOBAL ompi-c)
  pkg_check_modules(QCOLL_MPICH QUIET IMPORTED_TARGET GLOBAL mpich)
endif()

# collective_bench over each MPI: QCOLL_BUILD_MPI_BENCHMARKS (ON: one for each MPI found,
# OFF: none, "openmpi" or "mpich": that one). qcoll_mpi_benchmarks(<out>) lists the MPIs
# it is built for here, by name (openmpi, mpich), and qcoll_mpi_benchmark(<mpi> <out>)
# names its target. benchmarks/CMakeLists.txt builds them and tests/mpi.cmake runs them,
# from these two: tests/ is configured before benchmarks/, so it cannot ask whether the
# targets exist (the top-level CMakeLists.txt says why).
set(QCOLL_BUILD_MPI_BENCHMARKS ON CACHE STRING "Build collective_bench for each MPI found (ON), none (OFF), or one: openmpi, mpich")
set_property(CACHE QCOLL_BUILD_MPI_BENCHMARKS PROPERTY STRINGS ON OFF openmpi mpich)
function(qcoll_mpi_benchmarks out)
  set(mpis "")
  foreach(mpi openmpi mpich)
    string(TOUPPER ${mpi} package)
    if(NOT QCOLL_BUILD_BENCHMARKS OR NOT TARGET PkgConfig::QCOLL_${package})
      continue()
    endif()
    if(QCOLL_BUILD_MPI_BENCHMARKS STREQUAL mpi OR
       (NOT QCOLL_BUILD_MPI_BENCHMARKS MATCHES "^(openmpi|mpich)$" AND QCOLL_BUILD_MPI_BENCHMARKS))
      list(APPEND mpis ${mpi})
    endif()
  endforeach()
  set(${out} ${mpis} PARENT_SCOPE)
endfunction()
function(qcoll_mpi_benchmark mpi out)
  if(mpi STREQUAL "openmpi")
    set(${out} collective_bench_mpi PARENT_SCOPE)  # the name benchmarks/qcoll_peer_bench runs
  else()
    set(${out} collective_bench_${mpi} PARENT_SCOPE)
  endif()
endfunction()
