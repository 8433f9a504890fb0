#!/usr/bin/env bash
# Checks an strace -f log (from deploy/systemd/sandbox-run.sh) against relay-server.service:
#   - every system call is in SystemCallFilter=@system-service minus ~@privileged (expanded by
#     this host's systemd-analyze, so the list matches the systemd that will enforce it);
#   - every socket family is in RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX;
#   - no mapping was made writable and executable (MemoryDenyWriteExecute=yes).
#   deploy/systemd/check-trace.sh <trace-file>      exit 0 clean, 1 violations, 77 no systemd-analyze
set -euo pipefail
trace=$1
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not installed" >&2; exit 77; }
python3 - "$trace" <<'PY'
import re, subprocess, sys

def groups():
    out = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True, text=True, check=True).stdout
    table, current = {}, None
    for line in out.splitlines():
        if line.startswith("@"):
            current = line.split()[0]; table[current] = []
        elif current and line.strip() and not line.strip().startswith("#"):
            table[current].append(line.strip())
    return table

table = groups()
def expand(name, seen=None):
    seen = seen or set()
    if name in seen: return set()
    seen.add(name)
    result = set()
    for member in table.get(name, []):
        result |= expand(member, seen) if member.startswith("@") else {member}
    return result

allowed = expand("@system-service") - expand("@privileged")
used, families, wx = {}, set(), []
# "<... name resumed>" lines finish a call already counted at its "<unfinished ...>" start.
call = re.compile(r"^\d+\s+([a-z0-9_]+)\(")
for line in open(sys.argv[1], errors="replace"):
    m = call.match(line)
    if not m: continue
    name = m.group(1)
    used[name] = used.get(name, 0) + 1
    if name == "socket":
        f = re.search(r"socket\((AF_[A-Z0-9]+|\d+)", line)
        if f: families.add(f.group(1))
    if name in ("mmap", "mprotect", "pkey_mprotect") and "PROT_WRITE" in line and "PROT_EXEC" in line:
        wx.append(line.strip())

problems = []
denied = sorted(n for n in used if n not in allowed and n not in ("exit", "exit_group", "execve"))
# execve: only the wrapper's own exec of the binary (systemd execs it before the filter applies).
if denied: problems.append("system calls outside @system-service ~@privileged: " + ", ".join(f"{n} ({used[n]}x)" for n in denied))
bad_families = sorted(families - {"AF_INET", "AF_INET6", "AF_UNIX"})
if bad_families: problems.append("socket families outside RestrictAddressFamilies: " + ", ".join(bad_families))
if wx: problems.append("writable+executable mappings (MemoryDenyWriteExecute): " + "; ".join(wx[:3]))
print(f"{len(used)} distinct system calls, {sum(used.values())} calls; socket families: {', '.join(sorted(families)) or 'none'}")
for p in problems: print("VIOLATION: " + p)
sys.exit(1 if problems else 0)
PY
