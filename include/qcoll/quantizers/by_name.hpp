#pragma once
/// @file
/// The quantizers qcoll knows by name, in one list, for every program that chooses one
/// at run time — the benchmarks, the examples, the PyTorch hook — as xsimd keeps its
/// architectures in one `arch_list`. A new quantizer is its own header (with `name`,
/// `reads` and `from_spec`, quantizers/spec.hpp) and one entry in `named_quantizers`.
///
///     quantizers::with_quantizer(quantizers::parse_quantizer_spec("k_level4/1024"),
///                                [&](const auto& quantizer) { run(quantizer); });
///
/// The written form is "name[bits][/group]": one_bit, one_bit/4096, k_level4,
/// k_level8/1024, bfp8, bfp4/16, identity.

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/quantizers/bfp.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/quantizers/k_level.hpp>
#include <qcoll/quantizers/one_bit.hpp>
#include <qcoll/quantizers/spec.hpp>

#include <charconv>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>

namespace qcoll::quantizers {

template <class... Q>
struct quantizer_list {};

/// The one list.
using named_quantizers = quantizer_list<one_bit, k_level, bfp, identity<float>>;

namespace detail {

template <class... Q>
std::string names_of(quantizer_list<Q...>) {
  std::string names;
  ((names += (names.empty() ? "" : ", ") + std::string(Q::name)), ...);
  return names;
}

template <class... Q>
bool is_named(std::string_view name, quantizer_list<Q...>) {
  return ((name == Q::name) || ...);
}

template <class... Q>
spec_reads reads_of(std::string_view name, quantizer_list<Q...>) {
  spec_reads reads;
  const auto take = [&](std::string_view candidate, spec_reads its) {
    if (name == candidate) reads = its;
  };
  (take(Q::name, Q::reads), ...);
  return reads;
}

template <class Fn, class Q, class... Rest>
decltype(auto) dispatch(const quantizer_spec& spec, Fn& fn) {
  if constexpr (sizeof...(Rest) == 0) {
    if (spec.name != Q::name)
      qcoll::detail::throw_error(errc::invalid_argument, "unknown quantizer '{}' ({})", spec.name,
                                 names_of(named_quantizers{}));
    return fn(Q::from_spec(spec));
  } else {
    if (spec.name == Q::name) return fn(Q::from_spec(spec));
    return dispatch<Fn, Rest...>(spec, fn);
  }
}

template <class Fn, class... Q>
decltype(auto) dispatch_in(quantizer_list<Q...>, const quantizer_spec& spec, Fn& fn) {
  return dispatch<Fn, Q...>(spec, fn);
}

template <template <class> class F, class List>
struct apply_each;
template <template <class> class F, class... Q>
struct apply_each<F, quantizer_list<Q...>> {
  using tuple = std::tuple<F<Q>...>;
};

template <class List>
struct variant_of;
template <class... Q>
struct variant_of<quantizer_list<Q...>> {
  using type = std::variant<Q...>;
};

}  // namespace detail

/// "one_bit, k_level, bfp, identity": for messages and --help.
inline std::string quantizer_names() { return detail::names_of(named_quantizers{}); }

/// Which settings the quantizer called `name` reads (none for an unknown name).
inline spec_reads quantizer_reads(std::string_view name) { return detail::reads_of(name, named_quantizers{}); }

/// `spec` without the settings its quantizer does not read: for callers that hold a
/// default of each setting for every quantizer (the PyTorch hook's bits and group_size).
inline quantizer_spec only_what_it_reads(quantizer_spec spec) {
  const spec_reads reads = quantizer_reads(spec.name);
  if (!reads.bits) spec.bits.reset();
  if (!reads.group) spec.group.reset();
  return spec;
}

/// Calls fn(quantizer) with the quantizer `spec` names, made by its `from_spec`; fn is
/// called with each quantizer type of the list, so it must compile for all of them.
/// @par Errors qcoll::error (invalid_argument): an unknown name (the message lists the
/// known ones), or a setting the quantizer refuses, naming the value.
template <class Fn>
decltype(auto) with_quantizer(const quantizer_spec& spec, Fn&& fn) {
  return detail::dispatch_in(named_quantizers{}, spec, fn);
}

/// std::tuple<F<Q>...> over the list: per-quantizer state kept side by side.
template <template <class> class F>
using each_quantizer = typename detail::apply_each<F, named_quantizers>::tuple;

/// std::variant of the listed quantizers: one chosen at run time, held by value.
using any_quantizer = typename detail::variant_of<named_quantizers>::type;

/// Parses "name[bits][/group]". The name is a listed one; digits after it are the bit
/// count, unless the whole head is a name. Nothing is checked against the quantizer
/// here but its name: from_spec refuses what it does not take.
/// @par Errors qcoll::error (invalid_argument) naming the text.
inline quantizer_spec parse_quantizer_spec(std::string_view text) {
  const auto number = [&](std::string_view digits, const char* what) -> std::size_t {
    std::size_t value = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size())
      qcoll::detail::throw_error(errc::invalid_argument, "quantizer '{}': the {} is not a whole number", text, what);
    return value;
  };
  quantizer_spec spec;
  std::string_view head = text;
  if (const std::size_t slash = text.find('/'); slash != std::string_view::npos) {
    head = text.substr(0, slash);
    spec.group = number(text.substr(slash + 1), "group size");
    if (*spec.group == 0)
      qcoll::detail::throw_error(errc::invalid_argument, "quantizer '{}': the group size must be positive", text);
  }
  if (!detail::is_named(head, named_quantizers{})) {
    const std::size_t digits = head.find_last_not_of("0123456789") + 1;
    if (digits < head.size() && detail::is_named(head.substr(0, digits), named_quantizers{})) {
      const std::size_t bits = number(head.substr(digits), "bit count");
      if (bits > 64)
        qcoll::detail::throw_error(errc::invalid_argument, "quantizer '{}': {} bits per value is more than 64", text,
                                   bits);
      spec.bits = static_cast<unsigned>(bits);
      head = head.substr(0, digits);
    }
  }
  spec.name = std::string(head);
  if (!detail::is_named(head, named_quantizers{}))
    qcoll::detail::throw_error(errc::invalid_argument, "unknown quantizer '{}' ({}; written name[bits][/group])",
                               text, quantizer_names());
  return spec;
}

/// The written form of `spec` ("k_level4/1024"), which parse_quantizer_spec reads back.
inline std::string to_string(const quantizer_spec& spec) {
  std::string text = spec.name;
  if (spec.bits) text += std::to_string(*spec.bits);
  if (spec.group) {
    text += '/';  // (appended apart: g++ 12 warns -Wrestrict on "/" + std::string)
    text += std::to_string(*spec.group);
  }
  return text;
}

}  // namespace qcoll::quantizers
