#!/usr/bin/env python3
"""Where two builds differ, function by function, in instructions per response.

Each DIR holds the two callgrind outputs of one build that
`BENCH_CG_ONLY=1 BENCH_CG_KEEP=DIR BENCH_BIN=<build> scripts/bench-pipeline.sh` leaves
(cg-<n1>.out and cg-<n2>.out: the relay after n1 and after n2 sequential requests, each pushed).
A function's cost per response is its difference between the two runs divided by n2 - n1, so
start-up and shutdown cancel out, as in the benchmark's own figure.

  scripts/cg-diff.py OLD_DIR NEW_DIR [--inclusive] [--top N]

Prints the functions whose cost per response changed most (self cost; --inclusive: with their
callees, which names the subsystem that grew), then both totals. Needs callgrind_annotate.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

LINE = re.compile(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$")


def costs(path, inclusive):
    """Function -> instructions, from callgrind_annotate (every function: threshold 100 %)."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", f"--inclusive={'yes' if inclusive else 'no'}", path],
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = LINE.match(line)
        if not m or ":" not in m.group(2):
            continue
        # "file:function [object]"; the same function may be listed once per file.
        name = m.group(2).split(":", 1)[1].split(" [")[0].strip()
        found[name] = found.get(name, 0) + int(m.group(1).replace(",", ""))
    return found


def per_response(directory, inclusive):
    runs = sorted(glob.glob(os.path.join(directory, "cg-*.out")), key=lambda p: int(re.search(r"cg-(\d+)\.out$", p).group(1)))
    if len(runs) != 2:
        sys.exit(f"cg-diff: {directory} must hold exactly two cg-<n>.out files (BENCH_CG_KEEP), found {len(runs)}")
    (n1, p1), (n2, p2) = [(int(re.search(r"cg-(\d+)\.out$", p).group(1)), p) for p in runs]
    a, b = costs(p1, inclusive), costs(p2, inclusive)
    return {k: (b.get(k, 0) - a.get(k, 0)) / (n2 - n1) for k in set(a) | set(b)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--inclusive", action="store_true", help="cost with callees (subsystems) instead of self cost")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    old, new = per_response(args.old, args.inclusive), per_response(args.new, args.inclusive)
    names = sorted(set(old) | set(new), key=lambda k: -abs(new.get(k, 0) - old.get(k, 0)))
    print(f"{'old':>10} {'new':>10} {'change':>10}  function (instructions per response{', inclusive' if args.inclusive else ''})")
    for k in names[:args.top]:
        o, n = old.get(k, 0), new.get(k, 0)
        print(f"{o:10.0f} {n:10.0f} {n - o:+10.0f}  {k[:140]}")
    if not args.inclusive:
        print(f"{sum(old.values()):10.0f} {sum(new.values()):10.0f} {sum(new.values()) - sum(old.values()):+10.0f}  total")


if __name__ == "__main__":
    main()
