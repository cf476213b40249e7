#pragma once
/// @file
/// MPI's C API as the MPI transport includes it, and MPI's words for what it reports
/// (an error code's text, a thread level's name). Every header of transports/mpi/
/// includes this one before `<mpi.h>`, so whichever of them comes first keeps MPI's
/// C++ bindings out.

// The C API only: the deprecated C++ bindings would need libmpi_cxx (a program that
// wants them includes <mpi.h> itself first).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <array>
#include <cstddef>
#include <string>

namespace qcoll::transports::mpi::detail {

inline std::string mpi_error_text(int code) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  if (MPI_Error_string(code, text.data(), &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text.data(), static_cast<std::size_t>(length));
}

inline const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}

}  // namespace qcoll::transports::mpi::detail
