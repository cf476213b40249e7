// Exact or compressed, chosen from measurements: one qcoll::adaptive_allreduce per
// gradient bucket. Each bucket's first calls time the exact allreduce and the 1-bit
// compressed one in turn; from then on it runs the faster, and rank 0 prints why. On
// loopback the small buckets stay exact; on a slow network the large ones compress.
//
//   qcoll-run -n 4 compression_choice                                   # shared memory
//   benchmarks/netlab -n 4 --rate 1gbit -- build/examples/compression_choice   # 1 Gbit/s
//
// Options: --sizes LIST (bucket sizes in bytes, K/M suffixes; default 4K,64K,1M,16M),
// --calls N (calls per bucket, default 8: the first 4 are the probes), --quantizer
// SPEC (any of qcoll's quantizers, written name[bits][/group]: one_bit, k_level4,
// bfp8/16, ...; default one_bit).
// QCOLL_COMPRESSION=exact|compressed overrides the choice; QCOLL_DEBUG=INFO has every
// rank write it. Exit status: 0, or 2 on errors.

#include <qcoll/adaptive_allreduce.hpp>
#include <qcoll/communicator.hpp>
#include <qcoll/quantizers/by_name.hpp>

#include <fmt/format.h>

#include "launched_main.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct settings {
  std::vector<std::size_t> sizes{4 << 10, 64 << 10, 1 << 20, 16 << 20};
  std::size_t calls = 8;
  qcoll::quantizers::quantizer_spec quantizer{.name = "one_bit"};
};

std::size_t parse_bytes(std::string_view text) {
  std::string digits(text);
  std::size_t scale = 1;
  if (!digits.empty() && (digits.back() == 'K' || digits.back() == 'M')) {
    scale = digits.back() == 'K' ? std::size_t{1} << 10 : std::size_t{1} << 20;
    digits.pop_back();
  }
  char* end = nullptr;
  const unsigned long long value = std::strtoull(digits.c_str(), &end, 10);
  if (digits.empty() || *end != '\0' || value == 0 || value * scale % sizeof(float) != 0)
    throw std::invalid_argument(fmt::format("'{}' is not a positive size in bytes of whole floats", text));
  return value * scale;
}

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (i + 1 == argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const std::string_view value = argv[i + 1];
    if (flag == "--sizes") {
      s.sizes.clear();
      for (std::size_t begin = 0; begin <= value.size();) {
        const std::size_t comma = std::min(value.find(',', begin), value.size());
        s.sizes.push_back(parse_bytes(value.substr(begin, comma - begin)));
        begin = comma + 1;
      }
    } else if (flag == "--quantizer") {
      s.quantizer = qcoll::quantizers::parse_quantizer_spec(value);
    } else if (flag == "--calls") {
      char* end = nullptr;
      const std::string text(value);
      s.calls = std::strtoull(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || s.calls == 0)
        throw std::invalid_argument(fmt::format("--calls takes a positive whole number, not '{}'", value));
    } else {
      throw std::invalid_argument(fmt::format("unknown option {}", flag));
    }
  }
  return s;
}

/// Every bucket size through an adaptive_allreduce over `quantizer`.
template <class Communicator, class Quantizer>
void run_buckets(Communicator& comm, const settings& s, const Quantizer& quantizer) {
  for (const std::size_t bytes : s.sizes) {
    const std::size_t count = bytes / sizeof(float);
    qcoll::adaptive_allreduce bucket(comm, count, quantizer);
    std::vector<float> gradient(count);
    for (std::size_t call = 0; call < s.calls; ++call) {
      for (std::size_t i = 0; i < count; ++i)  // a gradient-like signal that changes from step to step
        gradient[i] = 0.01f * std::sin(0.001f * float(i) + float(call)) + 0.001f * float(comm.rank());
      bucket.allreduce(std::span(gradient), qcoll::reduce_op::avg);
    }
    if (comm.rank() == 0) {
      fmt::print("{}\n", bucket.decided() ? bucket.explanation()
                                          : fmt::format("{} bytes: undecided after {} calls", bytes, s.calls));
      std::fflush(stdout);
    }
  }
}

template <class Communicator>
int run(Communicator& comm, const settings& s, std::string_view transport) {
  if (comm.rank() == 0)
    fmt::print("{} ranks over {}: per bucket, {} calls of an adaptive allreduce (exact or compressed by {})\n",
               comm.size(), transport, s.calls, qcoll::quantizers::to_string(s.quantizer));
  qcoll::quantizers::with_quantizer(s.quantizer, [&](const auto& quantizer) { run_buckets(comm, s, quantizer); });
  comm.barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return qcoll_examples::launched_main("compression_choice", argc, argv, parse,
                                       [](auto& comm, const settings& s, std::string_view transport) {
                                         return run(comm, s, transport);
                                       });
}
