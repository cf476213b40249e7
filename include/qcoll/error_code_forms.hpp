#pragma once
/// @file
/// error_code_forms<Transport>: the std::error_code forms of communicator<Transport>'s
/// calls, written once here instead of beside each throwing form. Each is the throwing
/// call with the same arguments plus `std::error_code& ec`, noexcept: `ec` is cleared
/// on success and set to the code the throwing form would have thrown with
/// (not_enough_memory for std::bad_alloc, invalid_argument for an exception that carries
/// no code). The communicator derives from this class (CRTP) and names each of these
/// overloads with a using-declaration, so they are its members like the throwing forms.

#include <qcoll/collective_handle.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/outcome.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/plan_base.hpp>
#include <qcoll/transports/subgroup.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <system_error>

namespace qcoll {

template <transport Transport>
class communicator;

template <transport Transport>
class error_code_forms {
  using derived = communicator<Transport>;
  using channel_type = transports::subgroup<Transport>;

 public:
  template <element T>
  void allreduce(std::span<const T> in, std::span<T> out, reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(in, out, op); });
  }
  template <element T>
  void allreduce(std::span<T> data, reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(data, op); });
  }
  template <element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().reduce_scatter(in, out, op); });
  }
  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().all_gather(in, out); });
  }
  template <element T>
  void broadcast(std::span<T> data, rank_t root, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().broadcast(data, root); });
  }
  void barrier(std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().barrier(); });
  }
  template <element T>
  void send(std::span<const T> data, rank_t to, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().send(data, to); });
  }
  template <element T>
  void recv(std::span<T> data, rank_t from, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().recv(data, from); });
  }
  template <element T>
  void send_recv(std::span<const T> outgoing, rank_t to, std::span<T> incoming, rank_t from,
                 std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().send_recv(outgoing, to, incoming, from); });
  }
  template <allreduce_plan<channel_type> Plan>
  void allreduce(Plan& plan, std::span<const typename Plan::value_type> in, std::span<typename Plan::value_type> out,
                 reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(plan, in, out, op); });
  }
  template <allreduce_plan<channel_type> Plan>
  void allreduce(Plan& plan, std::span<typename Plan::value_type> data, reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(plan, data, op); });
  }
  template <allreduce_plan<channel_type> Plan>
  void start_allreduce(Plan& plan, std::span<const typename Plan::value_type> in,
                       std::span<typename Plan::value_type> out, reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_allreduce(plan, in, out, op); });
  }
  template <allreduce_plan<channel_type> Plan>
  void start_allreduce(Plan& plan, std::span<typename Plan::value_type> data, reduce_op op,
                       std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_allreduce(plan, data, op); });
  }
  template <allreduce_plan<channel_type> Plan>
  void allreduce(Plan& plan, std::span<const std::span<typename Plan::value_type>> tensors, reduce_op op,
                 std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(plan, tensors, op); });
  }
  template <allreduce_plan<channel_type> Plan>
  void start_allreduce(Plan& plan, std::span<const std::span<typename Plan::value_type>> tensors, reduce_op op,
                       std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_allreduce(plan, tensors, op); });
  }
  template <element T>
  void start_allreduce(std::span<const T> in, std::span<T> out, reduce_op op, collective_handle& handle,
                       std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_allreduce(in, out, op, handle); });
  }
  template <element T>
  void start_allreduce(std::span<T> data, reduce_op op, collective_handle& handle, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_allreduce(data, op, handle); });
  }
  template <element T>
  void start_reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op, collective_handle& handle,
                            std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_reduce_scatter(in, out, op, handle); });
  }
  template <element T>
  void start_all_gather(std::span<const T> in, std::span<T> out, collective_handle& handle,
                        std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_all_gather(in, out, handle); });
  }
  template <element T>
  void start_broadcast(std::span<T> data, rank_t root, collective_handle& handle, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_broadcast(data, root, handle); });
  }
  // ---- on device memory (a device_stream first)

  template <element T>
  void allreduce(execution::device_stream where, std::span<const T> in, std::span<T> out, reduce_op op,
                 std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(where, in, out, op); });
  }
  template <element T>
  void allreduce(execution::device_stream where, std::span<T> data, reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(where, data, op); });
  }
  template <element T>
  void reduce_scatter(execution::device_stream where, std::span<const T> in, std::span<T> out, reduce_op op,
                      std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().reduce_scatter(where, in, out, op); });
  }
  template <element T>
  void all_gather(execution::device_stream where, std::span<const T> in, std::span<T> out, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().all_gather(where, in, out); });
  }
  template <element T>
  void broadcast(execution::device_stream where, std::span<T> data, rank_t root, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().broadcast(where, data, root); });
  }
  void barrier(execution::device_stream where, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().barrier(where); });
  }
  template <element T>
  void send(execution::device_stream where, std::span<const T> data, rank_t to, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().send(where, data, to); });
  }
  template <element T>
  void recv(execution::device_stream where, std::span<T> data, rank_t from, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().recv(where, data, from); });
  }
  template <element T>
  void send_recv(execution::device_stream where, std::span<const T> outgoing, rank_t to, std::span<T> incoming,
                 rank_t from, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().send_recv(where, outgoing, to, incoming, from); });
  }
  template <allreduce_plan<channel_type> Plan>
  void allreduce(execution::device_stream where, Plan& plan, std::span<const typename Plan::value_type> in,
                 std::span<typename Plan::value_type> out, reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(where, plan, in, out, op); });
  }
  template <allreduce_plan<channel_type> Plan>
  void allreduce(execution::device_stream where, Plan& plan, std::span<typename Plan::value_type> data, reduce_op op,
                 std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(where, plan, data, op); });
  }
  template <allreduce_plan<channel_type> Plan>
  void allreduce(execution::device_stream where, Plan& plan, std::span<const std::span<typename Plan::value_type>> tensors,
                 reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().allreduce(where, plan, tensors, op); });
  }
  template <allreduce_plan<channel_type> Plan>
  void start_allreduce(execution::device_stream where, Plan& plan, std::span<const typename Plan::value_type> in,
                       std::span<typename Plan::value_type> out, reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_allreduce(where, plan, in, out, op); });
  }
  template <allreduce_plan<channel_type> Plan>
  void start_allreduce(execution::device_stream where, Plan& plan, std::span<typename Plan::value_type> data,
                       reduce_op op, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_allreduce(where, plan, data, op); });
  }
  template <element T>
  void start_allreduce(execution::device_stream where, std::span<const T> in, std::span<T> out, reduce_op op,
                       collective_handle& handle, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_allreduce(where, in, out, op, handle); });
  }
  template <element T>
  void start_allreduce(execution::device_stream where, std::span<T> data, reduce_op op, collective_handle& handle,
                       std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_allreduce(where, data, op, handle); });
  }
  template <element T>
  void start_reduce_scatter(execution::device_stream where, std::span<const T> in, std::span<T> out, reduce_op op,
                            collective_handle& handle, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_reduce_scatter(where, in, out, op, handle); });
  }
  template <element T>
  void start_all_gather(execution::device_stream where, std::span<const T> in, std::span<T> out,
                        collective_handle& handle, std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_all_gather(where, in, out, handle); });
  }
  template <element T>
  void start_broadcast(execution::device_stream where, std::span<T> data, rank_t root, collective_handle& handle,
                       std::error_code& ec) noexcept {
    ec = detail::capture([&] { self().start_broadcast(where, data, root, handle); });
  }

  std::optional<derived> split(std::int64_t color, std::int64_t key, std::error_code& ec) noexcept {
    std::optional<derived> result;
    ec = detail::capture([&] { result = self().split(color, key); });
    return result;
  }

 protected:
  error_code_forms() = default;

 private:
  derived& self() noexcept { return static_cast<derived&>(*this); }
};

}  // namespace qcoll
