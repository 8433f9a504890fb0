#!/usr/bin/env bash
# Builds and runs every libFuzzer target under Fuzz/ (one directory per target holding main.swift
# and fuzz.conf) for FUZZ_SECONDS each. `make test` only builds them (FUZZ_BUILD_ONLY=1), so a
# source change that breaks a fuzz target fails the suite instead of the next fuzzing session.
#
# Targets are built without SwiftPM: swiftc compiles the sources listed in fuzz.conf (plus its
# optional SWIFTC_FLAGS, e.g. -I for a system-library module map) together with the target's
# main.swift, which exports LLVMFuzzerTestOneInput, with -sanitize=fuzzer,address.
# New corpus entries go to .build/fuzz/corpus/<target>/ (the checked-in seeds are read-only
# input); crashes go to .build/fuzz/artifacts/<target>/ and make the script exit 1.
#
#   scripts/fuzz.sh                      # all targets, 60 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh HTTP1ParserFuzz
#   FUZZ_JOBS=2 scripts/fuzz.sh          # libFuzzer -fork=2 (parallel workers)
#   FUZZ_BUILD_ONLY=1 scripts/fuzz.sh    # build every target, run none
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
# libFuzzer reports crashes itself; Swift's interactive backtracer would only delay that.
export SWIFT_BACKTRACE=enable=no

FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_JOBS="${FUZZ_JOBS:-1}"
OUT=.build/fuzz

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for conf in Fuzz/*/fuzz.conf; do targets+=("$(basename "$(dirname "$conf")")"); done
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no targets under Fuzz/" >&2; exit 1; }

status=0
for target in "${targets[@]}"; do
  conf="Fuzz/$target/fuzz.conf"
  [ -f "$conf" ] || { echo "fuzz: $conf not found" >&2; exit 64; }
  SOURCES="" CORPUS="" DICT="" SWIFTC_FLAGS="" MODULES="" CSOURCES="" CFLAGS=""
  # shellcheck source=/dev/null
  . "$conf"
  mkdir -p "$OUT/corpus/$target" "$OUT/artifacts/$target"
  binary="$OUT/$target"
  echo "== $target: building"
  # MODULES: package modules the SOURCES import ("Name=glob ..."), each compiled (instrumented
  # too) into its own module + object first, in order, so `import Name` resolves.
  mods="$OUT/modules/$target"
  rm -rf "$mods"; mkdir -p "$mods"
  objects=()
  for module in $MODULES; do
    name=${module%%=*}
    # shellcheck disable=SC2086
    swiftc -O -g -parse-as-library -sanitize=fuzzer,address -wmo -package-name fuzz -module-name "$name" \
      -I "$mods" $SWIFTC_FLAGS -emit-module -emit-module-path "$mods/$name.swiftmodule" \
      -c ${module#*=} -o "$mods/$name.o"
    objects+=("$mods/$name.o")
  done
  # CSOURCES: package C targets' .c files the modules call (instrumented too), with CFLAGS.
  for csrc in $CSOURCES; do
    # shellcheck disable=SC2086
    clang -O1 -g -fsanitize=fuzzer-no-link,address $CFLAGS -c "$csrc" -o "$mods/$(basename "$csrc" .c).o"
    objects+=("$mods/$(basename "$csrc" .c).o")
  done
  # shellcheck disable=SC2086  # SOURCES holds globs and SWIFTC_FLAGS several words on purpose
  swiftc -O -g -parse-as-library -sanitize=fuzzer,address -use-ld=lld \
    -package-name fuzz -module-name "$target" -I "$mods" $SWIFTC_FLAGS \
    $SOURCES "Fuzz/$target/main.swift" "${objects[@]}" -o "$binary"
  if [ -n "${FUZZ_BUILD_ONLY:-}" ]; then echo "== $target: built $binary"; continue; fi

  args=(-max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048
        -artifact_prefix="$OUT/artifacts/$target/")
  [ -n "$DICT" ] && args+=(-dict="$DICT")
  [ "$FUZZ_JOBS" -gt 1 ] && args+=(-fork="$FUZZ_JOBS" -ignore_crashes=0)
  echo "== $target: fuzzing for ${FUZZ_SECONDS}s (seeds: ${CORPUS:-none})"
  log="$OUT/$target.log"
  set +e
  "$binary" "${args[@]}" "$OUT/corpus/$target" ${CORPUS:+"$CORPUS"} >"$log" 2>&1
  rc=$?
  set -e
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log" || true
  grep -E '^#[0-9]+.*(DONE|INITED)' "$log" | tail -2 || true
  if [ $rc -ne 0 ]; then
    echo "== $target: FAILED (exit $rc); log $log, artifacts in $OUT/artifacts/$target/" >&2
    grep -E 'ERROR|Fatal error|SUMMARY' "$log" | head -5 >&2 || true
    status=1
  else
    echo "== $target: no findings"
  fi
done
exit $status
