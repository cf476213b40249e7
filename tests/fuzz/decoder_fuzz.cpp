// Fuzz targets for every decoder.
//
// Input: [decoder index: 1 byte][element count: 2 bytes, little-endian][frame…].
// The target decodes the frame into a buffer of exactly that many values, with
// decode and with decode_accumulate, and aborts if a decoder accepts a frame of
// the wrong size or changes the output when it reports an error. Out-of-bounds
// reads and writes are for the sanitizers to catch (the asan preset runs this).
//
// Built two ways: with -DQCOLL_FUZZ=ON and clang, as a libFuzzer binary for long
// runs; otherwise with driver.hpp's main, which ctest runs over the corpus and for a
// few seconds per decoder family on frames the encoders made, mutated.

#include <qcoll/quantizers/bfp.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/quantizers/k_level.hpp>
#include <qcoll/quantizers/one_bit.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace qcoll;

constexpr std::size_t max_count = 4096;

struct decoder_case {
  std::string family;
  std::string name;
  std::function<std::size_t(std::size_t)> encoded_size;
  std::function<void(std::span<const float>, std::span<std::byte>)> encode;
  std::function<std::error_code(std::span<const std::byte>, std::span<float>, bool)> decode;
};

template <class Quantizer>
decoder_case make_case(std::string family, std::string name, Quantizer quantizer) {
  return {std::move(family), std::move(name),
          [quantizer](std::size_t n) { return quantizer.encoded_size(n); },
          [quantizer](std::span<const float> in, std::span<std::byte> frame) {
            std::vector<float> residual(in.size(), 0.125f);
            quantizer.encode(in, residual, frame, {.sequence = 7, .offset = 0});
          },
          [quantizer](std::span<const std::byte> frame, std::span<float> out, bool accumulate) {
            return accumulate ? quantizer.decode_accumulate(frame, out) : quantizer.decode(frame, out);
          }};
}

const std::vector<decoder_case>& decoders() {
  static const std::vector<decoder_case> cases = [] {
    using namespace quantizers;
    std::vector<decoder_case> list;
    list.push_back(make_case("identity", "identity<float>", identity<float>()));
    list.push_back(make_case("one_bit", "one_bit G=64", one_bit({.group_size = 64})));
    list.push_back(make_case("one_bit", "one_bit G=8 mean min_max",
                             one_bit({.group_size = 8, .threshold = threshold::group_mean,
                                      .reconstruction = reconstruction::min_max})));
    list.push_back(make_case("one_bit", "one_bit G=2048", one_bit()));
    list.push_back(make_case("k_level", "k_level 3 levels G=16", k_level({.levels = 3, .group_size = 16})));
    list.push_back(make_case("k_level", "k_level 256 levels G=64", k_level({.levels = 256, .group_size = 64})));
    list.push_back(make_case("k_level", "k_level 5 levels stochastic G=8",
                             k_level({.levels = 5, .group_size = 8, .rounding = rounding::stochastic, .seed = 3})));
    list.push_back(make_case("bfp", "bfp 8-bit block 32", bfp()));
    list.push_back(make_case("bfp", "bfp 3-bit block 8", bfp({.mantissa_bits = 3, .block_size = 8})));
    list.push_back(make_case("bfp", "bfp 12-bit whole tensor", bfp({.mantissa_bits = 12, .block_size = bfp_options::whole_tensor})));
    list.push_back(make_case("bfp", "bfp 32-bit block 16", bfp({.mantissa_bits = 32, .block_size = 16})));
    return list;
  }();
  return cases;
}

[[noreturn]] void fail(const decoder_case& decoder, const char* what, std::size_t count, std::size_t size) {
  std::fprintf(stderr, "%s: %s (count %zu, frame of %zu bytes)\n", decoder.name.c_str(), what, count, size);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const auto& decoder = decoders()[data[0] % decoders().size()];
  const std::size_t count = (data[1] | std::size_t{data[2]} << 8) % (max_count + 1);
  // A copy of exactly the frame's bytes, so a read past it is a heap overflow.
  const std::vector<std::byte> frame(reinterpret_cast<const std::byte*>(data) + 3,
                                     reinterpret_cast<const std::byte*>(data) + size);
  for (bool accumulate : {false, true}) {
    std::vector<float> out(count, 42.0f);
    const std::error_code result = decoder.decode(frame, out, accumulate);
    if (!result && frame.size() != decoder.encoded_size(count)) fail(decoder, "accepted a frame of the wrong size", count, frame.size());
    if (result)
      for (float v : out)
        if (!(v == 42.0f)) fail(decoder, "changed the output although it reported an error", count, frame.size());
  }
  return 0;
}

#if !defined(QCOLL_LIBFUZZER)
#include "driver.hpp"

namespace {

/// A frame the decoder's own encoder made from random values (an infinity now and then);
/// it must decode, which is checked here, before the driver mutates it.
std::vector<std::uint8_t> valid_input(std::size_t index, std::mt19937_64& random) {
  const auto& decoder = decoders()[index];
  std::uniform_int_distribution<std::size_t> pick_count(0, random() % 4 == 0 ? max_count : 80);
  const std::size_t count = pick_count(random);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(1 << (random() % 20)));
  std::vector<float> values(count);
  for (float& v : values) v = normal(random);
  if (count && random() % 8 == 0) values[random() % count] = std::numeric_limits<float>::infinity();
  std::vector<std::byte> frame(decoder.encoded_size(count));
  decoder.encode(values, frame);
  std::vector<float> out(count);
  if (decoder.decode(frame, out, false)) fail(decoder, "rejected a valid frame", count, frame.size());
  std::vector<std::uint8_t> input{static_cast<std::uint8_t>(index), static_cast<std::uint8_t>(count & 0xff),
                                  static_cast<std::uint8_t>(count >> 8)};
  for (std::byte b : frame) input.push_back(std::to_integer<std::uint8_t>(b));
  return input;
}

}  // namespace

// decoder_fuzz [identity|one_bit|k_level|bfp] [driver options]: one family's decoders, or all.
int main(int argc, char** argv) {
  const bool has_family = argc > 1 && argv[1][0] != '-';
  const std::string family = has_family ? argv[1] : "";
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < decoders().size(); ++i)
    if (family.empty() || decoders()[i].family == family) chosen.push_back(i);
  if (chosen.empty()) {
    std::fprintf(stderr, "usage: decoder_fuzz [identity|one_bit|k_level|bfp] [driver options]\n");
    return 2;
  }
  const std::string name = "decoder_fuzz " + (family.empty() ? std::string("all") : family);
  return qcoll::test::fuzz::drive(
      has_family ? argc - 1 : argc, has_family ? argv + 1 : argv, name,
      [&](std::mt19937_64& random) { return valid_input(chosen[random() % chosen.size()], random); }, 1);
}
#endif
