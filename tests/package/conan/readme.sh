#!/usr/bin/env bash
# Test package.conan: README's offline Conan commands, run as written. The lines of the
# code blocks after <!-- conan-offline-create --> and <!-- conan-offline-consume --> run
# one by one: the first in a copy of this checkout (a clone's files: git ls-files), the
# second in a project made of README's conanfile.txt (<!-- conan-conanfile -->) and
# test_package's CMakeLists.txt and source, which use the find_package and
# target_link_libraries lines README shows. Then that project's program runs.
#   tests/package/conan/readme.sh <work dir>
# Conan's home (its cache) lies in <work dir>; `pip` is that of a virtual environment
# made by tools/python-tools, so README's `pip install` goes there.
set -euo pipefail

fail() {
  echo "package.conan FAILED: $*" >&2
  exit 1
}
[ $# -eq 1 ] || fail "usage: $0 <work dir>"
root="$(cd "$(dirname "$0")/../../.." && pwd)"
mkdir -p "$1"
work="$(cd "$1" && pwd)"

# The lines of the code block after README's marker <!-- $1 -->, comments dropped.
readme_block() {
  awk -v marker="<!-- $1 -->" '
    $0 == marker { found = 1; next }
    found && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' "$root/README.md"
}
run_block() {
  local block
  block="$(readme_block "$1" | grep -v '^[[:space:]]*#' || true)"
  [ -n "$block" ] || fail "README.md has no code block after <!-- $1 -->"
  while IFS= read -r line; do
    echo "+ $line"
    eval "$line" || fail "README's line '$line' (in $PWD)"
  done <<<"$block"
}

export CONAN_HOME="$work/home"  # never the user's ~/.conan2
venv="$("$root/tools/python-tools" conan==2.34.0)" || fail "tools/python-tools conan==2.34.0 (output above)"
export PATH="$venv/bin:$PATH"

clone="$work/qcoll"
rm -rf "$clone" "$work/project"
mkdir -p "$clone" "$work/project"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$clone") ||
  fail "copying the checkout's files"
(cd "$clone" && run_block conan-offline-create)

project="$work/project"
readme_block conan-conanfile >"$project/conanfile.txt"
cp "$root/test_package/CMakeLists.txt" "$root/test_package/test_package.cpp" "$project/"
export QCOLL="$clone"
(cd "$project" && run_block conan-offline-consume)
program="$(find "$project/build" -name test_package -type f -perm -u+x | head -n 1)"
[ -n "$program" ] || fail "the project's program was not built"
said="$("$program")" || fail "the project's program failed: $said"
echo "package.conan: README's commands built a project that says: $said"
