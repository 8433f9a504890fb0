#!/usr/bin/env bash
# Instructions per request spent in the HTTP/1.1 parser (callgrind), for three request shapes.
# Builds the parser sources with a small harness (-O, DWARF 4 so valgrind 3.19 can read it), runs
# N and 2N requests and reports the difference / N, which cancels process start-up.
# Needs valgrind (make bench-deps). Not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
N="${N:-20000}"
out=.build/h1parser-instructions
mkdir -p "$out"
swiftc -O -g -dwarf-version=4 -parse-as-library -package-name bench -module-name H1ParserInstructions \
  Sources/HTTPServer/HTTPVersion.swift Sources/HTTPServer/HTTP1*.swift \
  scripts/h1parser-instructions/main.swift -o "$out/harness"
count() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$out/harness" "$1" "$2" 2>&1 \
    | sed -n 's/.*I *refs: *//p' | tr -d ,
}
for kind in wrk browser post; do
  one=$(count "$N" "$kind")
  two=$(count $((2 * N)) "$kind")
  echo "$kind: $(( (two - one) / N )) instructions/request"
done
