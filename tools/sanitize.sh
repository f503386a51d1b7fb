#!/usr/bin/env bash
# Issue 35 item 1: the whole project under AddressSanitizer +
# UndefinedBehaviorSanitizer (+ LeakSanitizer), every test but the perf,
# bench, soak and fuzz ones. docs/testing.md ("Sanitizers") says when to run
# it and what each option below is for.
#
#   tools/sanitize.sh [--build-only] [ctest arguments...]
#
# Builds in build-asan/ (PARTITA_ASAN_BUILD overrides), runs ctest there,
# prints one summary line and exits non-zero on any sanitizer report or
# failed test.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${PARTITA_ASAN_BUILD:-$src/build-asan}
jobs=${PARTITA_ASAN_JOBS:-2}
build_only=0
if [[ ${1:-} == --build-only ]]; then build_only=1; shift; fi

# CXXFLAGS/LDFLAGS from the environment (not CMAKE_CXX_FLAGS) so that the
# projects the install tests configure from this build inherit them too.
export CXXFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
export LDFLAGS="-fsanitize=address,undefined"
if [[ ! -f $build/CMakeCache.txt ]]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
    -DMPI_CXX_COMPILER="$(command -v mpicxx.mpich || command -v mpicxx)" \
    -DPARTITA_BUILD_BENCH=OFF -DPARTITA_BUILD_FUZZ=OFF >/dev/null
fi
cmake --build "$build" -j"$jobs"
(( build_only )) && exit 0

# Every sanitizer report goes to a file of its own under $reports (one per
# process that reported), so the summary counts them whatever the test's
# output did with them; the test itself fails too (a report ends the process
# with a non-zero status).
reports=$build/sanitizer-reports
rm -rf "$reports" && mkdir -p "$reports"
supp=$src/tools/sanitize/lsan.supp
# Each option is explained in docs/testing.md ("Sanitizers").
export ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=1:abort_on_error=0:exitcode=86:${PARTITA_ASAN_EXTRA:-}"
export UBSAN_OPTIONS="log_path=$reports/ubsan:print_stacktrace=1:halt_on_error=1:exitcode=87"
export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0:exitcode=88"

start=$(date +%s)
set +e
# Not the perf/bench tests (timing), the soak tests (hours), the fuzzers
# (they have their own AddressSanitizer build, fuzz/). ctest keeps only
# the first -LE it is given, so a caller's -LE replaces this one.
exclude=(-LE 'perf|bench|soak|fuzz')
for arg in "$@"; do
  [[ $arg == -LE || $arg == --label-exclude ]] && exclude=()
done
ctest --test-dir "$build" "${exclude[@]}" -V "$@" > "$build/sanitize-ctest.log" 2>&1
ctest_rc=$?
set -e
took=$(( $(date +%s) - start ))
grep -E "^ *[0-9]+/[0-9]+ Test +#|tests passed|The following tests|^\t[0-9]+ - " "$build/sanitize-ctest.log" | grep -v " Passed " || true
summary=$(grep -E '^[0-9]+% tests passed' "$build/sanitize-ctest.log" | tail -n 1 || true)
# AddressSanitizer and LeakSanitizer reports are files under $reports;
# UndefinedBehaviorSanitizer's (GCC's runtime prints them to stderr whatever
# log_path says) are counted in the ctest log.
files=$(find "$reports" -type f | sort)
asan=0
[[ -n $files ]] && asan=$(echo "$files" | wc -l)
ubsan=$(grep -c 'runtime error:' "$build/sanitize-ctest.log" || true)
if [[ $asan -gt 0 ]]; then
  echo "--- AddressSanitizer / LeakSanitizer reports ---"
  for f in $files; do echo "== $f"; head -n 60 "$f"; done
fi
if [[ $ubsan -gt 0 ]]; then
  echo "--- UndefinedBehaviorSanitizer reports ---"
  grep 'runtime error:' "$build/sanitize-ctest.log" | sort | uniq -c
fi
count=$((asan + ubsan))
echo "sanitize: ${summary:-no ctest summary}; $count sanitizer report(s) ($asan ASan/LSan, $ubsan UBSan); ${took} s; log $build/sanitize-ctest.log"
[[ $ctest_rc -eq 0 && $count -eq 0 ]]
