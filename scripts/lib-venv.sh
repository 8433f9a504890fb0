# Sourced by the lib-*-venv.sh files: one throwaway Python venv per tool, pinned.
# pinned_venv_python DIR PACKAGE VERSION prints DIR's python once PACKAGE==VERSION is installed
# there (recreating DIR when the installed version differs), or returns 1 when python3 is
# missing or the package cannot be installed (offline): callers skip with a message then.
# One maker at a time (flock on DIR.lock): tests that run in parallel in `make test`
# (WebhookCrossCheckTests, EventsEndToEndTests) must not delete a venv another is making or using.
pinned_venv_python() {
  local dir=$1 package=$2 version=$3
  command -v python3 >/dev/null || return 1
  mkdir -p "$(dirname "$dir")"
  (
    flock 9 || exit 1
    if ! "$dir/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$package') != '$version')" 2>/dev/null; then
      rm -rf "$dir"
      if ! { python3 -m venv "$dir" && "$dir/bin/pip" install -q "$package==$version"; } >/dev/null 2>&1; then
        rm -rf "$dir"
        exit 1
      fi
    fi
  ) 9>"$dir.lock" || return 1
  echo "$dir/bin/python"
}
