#pragma once
// PyTorch's key-value store (the one init_process_group hands a backend) as a qcoll
// store (include/qcoll/rendezvous/store.hpp): qcoll's transports meet through it, so
// a job has one rendezvous, PyTorch's.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/rendezvous/store.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace qcoll_torch {

class torch_store {
 public:
  explicit torch_store(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(std::string_view key, std::string_view value) {
    store_->set(std::string(key), std::vector<std::uint8_t>(value.begin(), value.end()));
  }

  std::string get(std::string_view key, qcoll::deadline until) {
    wait_for({std::string(key)}, until);
    const std::vector<std::uint8_t> value = store_->get(std::string(key));
    return {value.begin(), value.end()};
  }

  void wait_all(std::string_view prefix, qcoll::rank_t n, qcoll::deadline until) {
    std::vector<std::string> keys;
    for (qcoll::rank_t r = 0; r < n; ++r) keys.push_back(std::string(prefix) + std::to_string(r));
    wait_for(keys, until);
  }

 private:
  /// Waits for `keys` until the deadline; a timeout is qcoll's errc::timeout naming
  /// the keys no rank set (the store's own exception says only that it timed out).
  void wait_for(const std::vector<std::string>& keys, qcoll::deadline until) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - qcoll::clock::now());
    try {
      store_->wait(keys, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      std::string missing;
      for (const std::string& key : keys)
        if (!store_->check({key})) missing += (missing.empty() ? "" : ", ") + key;
      qcoll::detail::throw_error(qcoll::errc::timeout, "qcoll: PyTorch's store: no rank set {} in time ({})",
                                 missing.empty() ? std::string("the keys") : missing, e.what());
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
};

static_assert(qcoll::rendezvous::store<torch_store>);

}  // namespace qcoll_torch
