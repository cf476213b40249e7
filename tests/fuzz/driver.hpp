#pragma once
// What every fuzz target of this folder shares when it is not built as a libFuzzer
// binary (-DQCOLL_FUZZ=ON builds those, for the long runs of docs/testing.md):
//
//   <target> [--corpus DIR] [--seconds S] [--seed N]   replay every file of DIR (the
//       committed seeds and regression inputs), then for S seconds feed the target
//       valid inputs from its own generator, four in five of them mutated;
//   <target> --write-corpus DIR [--count N] [--seed N]  write N valid inputs into DIR:
//       the seed corpus, made by the library's own encoders.
//
// A target defines LLVMFuzzerTestOneInput (which aborts on a broken promise) and a
// generator of valid inputs; its main() is `return fuzz::drive(argc, argv, name, generator)`.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace qcoll::test::fuzz {

using bytes = std::vector<std::uint8_t>;
using generator = std::function<bytes(std::mt19937_64&)>;

/// Byte-level mutations: bit flips, byte writes, truncation, insertion, a length field
/// made huge, a region copied over another. The first `keep` bytes (the target's
/// selector bytes) are left alone, so most mutants stay aimed at one parser.
inline void mutate(bytes& input, std::mt19937_64& random, std::size_t keep = 0) {
  const int mutations = 1 + static_cast<int>(random() % 4);
  for (int m = 0; m < mutations && input.size() > keep; ++m) {
    const std::size_t at = keep + random() % (input.size() - keep);
    switch (random() % 6) {
      case 0: input[at] ^= static_cast<std::uint8_t>(1u << (random() % 8)); break;
      case 1: input[at] = static_cast<std::uint8_t>(random()); break;
      case 2: input.resize(at); break;
      case 3: input.insert(input.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::uint8_t>(random())); break;
      case 4:
        for (std::size_t i = at; i < std::min(input.size(), at + 1 + random() % 8); ++i) input[i] = 0xff;
        break;
      default: {
        const std::size_t from = keep + random() % (input.size() - keep), length = random() % 64;
        for (std::size_t i = 0; i < length && from + i < input.size() && at + i < input.size(); ++i)
          input[at + i] = input[from + i];
      }
    }
  }
}

inline bytes read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// The non-libFuzzer main (see the file comment). `keep`: bytes mutate() leaves alone.
inline int drive(int argc, char** argv, std::string_view name, const generator& valid_input, std::size_t keep = 0) {
  double seconds = 2.0;
  std::uint64_t seed = 1;
  std::size_t count = 32;
  std::filesystem::path corpus, write_to;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view option = argv[i];
    if (option == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (option == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (option == "--count") count = std::strtoull(argv[i + 1], nullptr, 10);
    else if (option == "--corpus") corpus = argv[i + 1];
    else if (option == "--write-corpus") write_to = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--corpus DIR] [--seconds S] [--seed N] | --write-corpus DIR [--count N]\n",
                   std::string(name).c_str());
      return 2;
    }
  }
  std::mt19937_64 random(seed);
  if (!write_to.empty()) {
    std::filesystem::create_directories(write_to);
    for (std::size_t i = 0; i < count; ++i) {
      const bytes input = valid_input(random);
      char file[32];
      std::snprintf(file, sizeof file, "seed-%03zu", i);
      std::ofstream(write_to / file, std::ios::binary)
          .write(reinterpret_cast<const char*>(input.data()), static_cast<std::streamsize>(input.size()));
    }
    std::printf("%s: wrote %zu seeds to %s\n", std::string(name).c_str(), count, write_to.c_str());
    return 0;
  }
  std::size_t replayed = 0;
  if (!corpus.empty()) {
    if (!std::filesystem::is_directory(corpus)) {
      std::fprintf(stderr, "%s: no corpus at %s\n", std::string(name).c_str(), corpus.c_str());
      return 2;
    }
    for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
      const bytes input = read_file(entry.path());
      LLVMFuzzerTestOneInput(input.data(), input.size());
      ++replayed;
    }
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::size_t runs = 0;
  while (std::chrono::steady_clock::now() < until) {
    for (int batch = 0; batch < 16; ++batch, ++runs) {
      bytes input = valid_input(random);
      if (runs % 5 != 0) mutate(input, random, keep);  // one in five stays valid
      LLVMFuzzerTestOneInput(input.data(), input.size());
    }
  }
  std::printf("%s: %zu corpus inputs, %zu generated inputs in %.1f s, no failure\n", std::string(name).c_str(),
              replayed, runs, seconds);
  return 0;
}

}  // namespace qcoll::test::fuzz
