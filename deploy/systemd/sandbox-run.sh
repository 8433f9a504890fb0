#!/usr/bin/env bash
# Runs a command under the parts of relay-server.service's sandbox that can be reproduced without
# systemd as PID 1, recording every system call for deploy/systemd/check-trace.sh:
#   - ProcSubset=pid + ProtectProc=invisible: a private /proc mounted subset=pid,hidepid=invisible
#   - MemoryDenyWriteExecute=yes: prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN) (Linux >= 6.3),
#     the same kernel mechanism systemd uses on new kernels; inherited across exec
#   - SystemCallFilter / RestrictAddressFamilies: not enforced here, but strace -f records the
#     calls so check-trace.sh can compare them with the unit's allow-list.
#   - User=: with SANDBOX_USER=<uid>:<gid> the command runs as that unprivileged user with no
#     supplementary groups (root behaves differently, e.g. SQLite chowns its WAL files as root).
#   deploy/systemd/sandbox-run.sh <trace-file> <command> [args...]
# Needs root (unshare, mount), strace and python3. Exit 77 when one is missing.
set -euo pipefail
trace=$1; shift
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root" >&2; exit 77; }
for tool in unshare strace /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed" >&2; exit 77; }
done
exec unshare --mount --propagation private -- /bin/sh -c '
  mount -t proc -o subset=pid,hidepid=invisible proc /proc || { echo "cannot mount a private /proc" >&2; exit 77; }
  trace=$1; shift
  drop=""
  if [ -n "${SANDBOX_USER:-}" ]; then
    drop="setpriv --reuid=${SANDBOX_USER%%:*} --regid=${SANDBOX_USER##*:} --clear-groups --"
  fi
  exec $drop /usr/bin/python3 -c "
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
    sys.stderr.write(\"PR_SET_MDWE failed: %s\n\" % os.strerror(ctypes.get_errno()))
    sys.exit(77)
os.execvp(\"strace\", [\"strace\", \"-f\", \"-qq\", \"-o\", sys.argv[1]] + sys.argv[2:])
" "$trace" "$@"
' sandbox-run "$trace" "$@"
