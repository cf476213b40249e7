#pragma once
/// @file
/// Payload transfers of any size: MPI's counts are `int`, so a payload of 2 GiB or
/// more travels as one element of a datatype that describes it in 1 GiB units.

#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/transports/mpi/c_api.hpp>

#include <mpi.h>

#include <array>
#include <climits>
#include <cstddef>

namespace qcoll::transports::mpi::detail {

/// A committed datatype over up to two byte ranges at absolute addresses (for
/// MPI_BOTTOM), any size: ranges of 2 GiB or more are described in 1 GiB units.
/// The caller frees it once the operation is posted (MPI keeps what it needs).
class byte_ranges_type {
 public:
  byte_ranges_type(const void* first, std::size_t first_bytes, const void* second, std::size_t second_bytes) {
    add(first, first_bytes);
    add(second, second_bytes);
    MPI_Type_create_struct(used_, lengths_.data(), addresses_.data(), types_.data(), &type_);
    MPI_Type_commit(&type_);
  }
  byte_ranges_type(const byte_ranges_type&) = delete;
  byte_ranges_type& operator=(const byte_ranges_type&) = delete;
  ~byte_ranges_type() {
    MPI_Type_free(&type_);
    if (units_ != MPI_DATATYPE_NULL) MPI_Type_free(&units_);
  }
  MPI_Datatype get() const noexcept { return type_; }

 private:
  static constexpr std::size_t unit = std::size_t{1} << 30;

  void add(const void* data, std::size_t bytes) {
    if (bytes == 0) return;
    MPI_Aint address = 0;
    MPI_Get_address(data, &address);
    if (bytes > std::size_t(INT_MAX)) {
      if (units_ == MPI_DATATYPE_NULL) {
        MPI_Type_contiguous(int(unit), MPI_BYTE, &units_);
        MPI_Type_commit(&units_);
      }
      push(address, int(bytes / unit), units_);
      address = MPI_Aint_add(address, MPI_Aint(bytes / unit * unit));
      bytes %= unit;
      if (bytes == 0) return;
    }
    push(address, int(bytes), MPI_BYTE);
  }
  void push(MPI_Aint address, int length, MPI_Datatype type) {
    addresses_[used_] = address;
    lengths_[used_] = length;
    types_[used_] = type;
    ++used_;
  }

  std::array<MPI_Aint, 4> addresses_{};
  std::array<int, 4> lengths_{};
  std::array<MPI_Datatype, 4> types_{};
  int used_ = 0;
  MPI_Datatype units_ = MPI_DATATYPE_NULL;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

/// A payload receive of `bytes` into `into`, any size.
inline int irecv_bytes(std::byte* into, std::size_t bytes, rank_t peer, tag_t tag, MPI_Comm comm,
                       MPI_Request& request) {
  if (bytes <= std::size_t(INT_MAX)) return MPI_Irecv(into, int(bytes), MPI_BYTE, int(peer), int(tag), comm, &request);
  byte_ranges_type type(nullptr, 0, into, bytes);
  return MPI_Irecv(MPI_BOTTOM, 1, type.get(), int(peer), int(tag), comm, &request);
}

/// A payload send of `bytes` from `data`, any size.
inline int isend_bytes(const std::byte* data, std::size_t bytes, rank_t peer, tag_t tag, MPI_Comm comm,
                       MPI_Request& request) {
  const int to = int(peer), mpi_tag = int(tag);
  if (bytes <= std::size_t(INT_MAX)) return MPI_Isend(data, int(bytes), MPI_BYTE, to, mpi_tag, comm, &request);
  byte_ranges_type type(nullptr, 0, data, bytes);
  return MPI_Isend(MPI_BOTTOM, 1, type.get(), to, mpi_tag, comm, &request);
}

}  // namespace qcoll::transports::mpi::detail
