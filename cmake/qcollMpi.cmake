# The MPIs qcoll's own tests, example and benchmark build against, found through
# pkg-config once for the whole build: PkgConfig::QCOLL_OPENMPI (Open MPI's ompi-c) and
# PkgConfig::QCOLL_MPICH, each a GLOBAL imported target where found. A project using
# transports/mpi.hpp links its own MPI instead (find_package(MPI), MPI::MPI_C).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(QCOLL_OPENMPI QUIET IMPORTED_TARGET GLOBAL ompi-c)
  pkg_check_modules(QCOLL_MPICH QUIET IMPORTED_TARGET GLOBAL mpich)
endif()
