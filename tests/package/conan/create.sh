#!/usr/bin/env bash
# Test package.conan_center_stubs (tests/package/conan.cmake): create qcoll's Conan
# package from this checkout with `conan create`, boost, fmt, xsimd and openssl from stand-ins
# for Conan Center's packages (center-stubs/), and run its test_package (test_package/).
# (package.conan runs README's commands with Debian's packages: readme.sh.)
#   tests/package/conan/create.sh <work dir> --center-stubs
# Everything Conan keeps lies in <work dir>: CONAN_HOME (its cache, holding the packages)
# and the test_package build. Conan itself comes from PyPI through tools/python-tools.
set -euo pipefail

fail() {
  echo "package.conan FAILED: $*" >&2
  exit 1
}
[ $# -eq 2 ] && [ "$2" = --center-stubs ] || fail "usage: $0 <work dir> --center-stubs"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
mkdir -p "$1"
work="$(cd "$1" && pwd)"

export CONAN_HOME="$work/home"  # never the user's ~/.conan2
venv="$("$root/tools/python-tools" conan==2.34.0)" ||
  fail "could not install Conan 2.34.0 from PyPI with tools/python-tools (output above)"
conan="$venv/bin/conan"

profile="$here/center-stubs/profile"
for stub in boost/1.74.0 fmt/9.1.0 xsimd/8.1.0 openssl/3.0.19; do
  "$conan" export "$here/center-stubs" --name "${stub%/*}" --version "${stub#*/}" ||
    fail "conan export of the $stub stand-in (output above)"
done

# conan create builds test_package inside the folder it is in: build a copy here, not in the sources.
rm -rf "$work/test_package"
cp -R "$root/test_package" "$work/test_package"

# --no-remote: every requirement is in the cache or a [platform_requires]; Conan Center is never asked.
"$conan" create "$root" --profile:all "$profile" --build=missing --no-remote --test-folder "$work/test_package" ||
  fail "conan create $root --profile:all $profile (output above)"
