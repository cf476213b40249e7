// The quantizers by name (quantizers/by_name.hpp): the written form and its errors,
// each listed quantizer made from its spec with the settings given, and the list's
// helpers. Part of the quantizer_tests executable.

#include <boost/test/unit_test.hpp>

#include <qcoll/quantizers/by_name.hpp>

#include <string>
#include <tuple>
#include <type_traits>
#include <variant>

using namespace qcoll;
using namespace qcoll::quantizers;

namespace {

/// The message of the qcoll::error `make` throws (invalid_argument), or "no error".
template <class Make>
std::string refusal(Make&& make) {
  try {
    make();
  } catch (const qcoll::error& e) {
    BOOST_TEST((e.code() == errc::invalid_argument));
    return e.what();
  }
  return "no error";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_SUITE(quantizers_by_name)

BOOST_AUTO_TEST_CASE(the_written_form_reads_back) {
  for (const std::string text : {"one_bit", "one_bit/4096", "k_level4", "k_level8/1024", "bfp8", "bfp4/16", "identity"})
    BOOST_TEST(to_string(parse_quantizer_spec(text)) == text);
  const quantizer_spec k = parse_quantizer_spec("k_level3/64");
  BOOST_TEST(k.name == "k_level");
  BOOST_TEST(k.bits.value_or(0) == 3u);
  BOOST_TEST(k.group.value_or(0) == 64u);
  const quantizer_spec o = parse_quantizer_spec("one_bit");
  BOOST_TEST((!o.bits && !o.group));
}

BOOST_AUTO_TEST_CASE(bad_text_is_refused_naming_it) {
  const std::string unknown = refusal([] { parse_quantizer_spec("two_bit"); });
  BOOST_TEST(contains(unknown, "'two_bit'"));
  BOOST_TEST(contains(unknown, quantizer_names()));
  BOOST_TEST(contains(refusal([] { parse_quantizer_spec("k_levelx"); }), "unknown quantizer 'k_levelx'"));
  BOOST_TEST(contains(refusal([] { parse_quantizer_spec("bfp8/abc"); }), "group size is not a whole number"));
  BOOST_TEST(contains(refusal([] { parse_quantizer_spec("k_level4/0"); }), "must be positive"));
  BOOST_TEST(contains(refusal([] { parse_quantizer_spec("k_level99999999999999999999"); }), "bit count"));
  BOOST_TEST(contains(refusal([] { parse_quantizer_spec("k_level100"); }), "more than 64"));
  BOOST_TEST(contains(refusal([] { parse_quantizer_spec(""); }), "unknown quantizer ''"));
}

BOOST_AUTO_TEST_CASE(settings_a_quantizer_refuses_are_named) {
  const auto make = [](const char* text) { return [text] { with_quantizer(parse_quantizer_spec(text), [](const auto&) {}); }; };
  BOOST_TEST(contains(refusal(make("k_level9")), "not bits=9"));
  BOOST_TEST(contains(refusal(make("k_level0")), "not bits=0"));
  BOOST_TEST(contains(refusal(make("one_bit4")), "one_bit takes no bit count, not bits=4"));
  BOOST_TEST(contains(refusal(make("identity/8")), "identity takes no group size, not group=8"));
  BOOST_TEST(contains(refusal(make("bfp17")), "not 17"));
  BOOST_TEST(contains(refusal(make("one_bit/12")), "not 12"));
  BOOST_TEST(contains(refusal([] { with_quantizer({.name = "nope"}, [](const auto&) {}); }), "unknown quantizer 'nope'"));
}

BOOST_AUTO_TEST_CASE(each_quantizer_is_made_with_the_settings_given) {
  with_quantizer(parse_quantizer_spec("k_level4/1024"), [](const auto& q) {
    using Q = std::decay_t<decltype(q)>;
    BOOST_TEST_REQUIRE((std::is_same_v<Q, k_level>));
    if constexpr (std::is_same_v<Q, k_level>) {
      BOOST_TEST(q.options().levels == 16u);
      BOOST_TEST(q.group_size() == 1024u);
    }
  });
  quantizer_spec seeded = parse_quantizer_spec("k_level2");
  seeded.seed = 77;
  with_quantizer(seeded, [](const auto& q) {
    if constexpr (std::is_same_v<std::decay_t<decltype(q)>, k_level>) BOOST_TEST(q.options().seed == 77u);
    else BOOST_FAIL("not k_level");
  });
  with_quantizer(parse_quantizer_spec("bfp6/16"), [](const auto& q) {
    if constexpr (std::is_same_v<std::decay_t<decltype(q)>, bfp>) {
      BOOST_TEST(q.options().mantissa_bits == 6u);
      BOOST_TEST(q.options().block_size == 16u);
    } else {
      BOOST_FAIL("not bfp");
    }
  });
  with_quantizer(parse_quantizer_spec("one_bit/4096"), [](const auto& q) {
    if constexpr (std::is_same_v<std::decay_t<decltype(q)>, one_bit>) BOOST_TEST(q.group_size() == 4096u);
    else BOOST_FAIL("not one_bit");
  });
  // Unset settings are the quantizer's defaults.
  with_quantizer(parse_quantizer_spec("bfp"), [](const auto& q) {
    if constexpr (std::is_same_v<std::decay_t<decltype(q)>, bfp>) BOOST_TEST(q.options().mantissa_bits == bfp_options{}.mantissa_bits);
    else BOOST_FAIL("not bfp");
  });
}

BOOST_AUTO_TEST_CASE(every_listed_quantizer_is_found_by_its_own_name) {
  // The list's every entry: its name parses, and with_quantizer makes that very type.
  std::size_t found = 0;
  std::apply(
      [&](auto... tags) {
        ((with_quantizer(parse_quantizer_spec(decltype(tags)::type::name),
                         [&](const auto& q) {
                           found += std::is_same_v<std::decay_t<decltype(q)>, typename decltype(tags)::type>;
                         })),
         ...);
      },
      each_quantizer<std::type_identity>{});
  BOOST_TEST(found == std::tuple_size_v<each_quantizer<std::type_identity>>);
  BOOST_TEST(std::variant_size_v<any_quantizer> == std::tuple_size_v<each_quantizer<std::type_identity>>);
  BOOST_TEST(quantizer_names() == "one_bit, k_level, bfp, identity");
}

BOOST_AUTO_TEST_CASE(only_what_it_reads_drops_the_settings_a_quantizer_does_not_read) {
  const quantizer_spec given{.name = "one_bit", .bits = 4, .group = 1024};
  const quantizer_spec kept = only_what_it_reads(given);
  BOOST_TEST((!kept.bits && kept.group.value_or(0) == 1024u));
  const quantizer_spec identity_spec = only_what_it_reads({.name = "identity", .bits = 4, .group = 1024});
  BOOST_TEST((!identity_spec.bits && !identity_spec.group));
  const quantizer_spec k = only_what_it_reads({.name = "k_level", .bits = 4, .group = 1024});
  BOOST_TEST((k.bits.value_or(0) == 4u && k.group.value_or(0) == 1024u));
}

BOOST_AUTO_TEST_SUITE_END()
