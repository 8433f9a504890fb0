#!/usr/bin/env bash
# Checks a built accessory-relay .deb (scripts/build-deb.sh runs it; `make test` too when a
# package of the current version is built): the exact file list, the conffile, Depends: (Debian
# packages only, the C libraries the binaries link, nothing from the Swift toolchain), the unit
# pointing at /usr/bin, the binaries' --version, and lintian with the package's overrides
# (errors and warnings fail). Takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
deb=${1:?usage: scripts/check-deb.sh <package.deb>}
fail() { echo "check-deb: FAIL: $*" >&2; exit 1; }

version=$(sed -n 's/^ *public static let version = "\(.*\)"$/\1/p' Sources/BuildInfo/BuildInfo.swift)
[ "$(dpkg-deb --field "$deb" Package)" = accessory-relay ] || fail "Package"
case "$(dpkg-deb --field "$deb" Version)" in "$version"-*) ;; *) fail "Version $(dpkg-deb --field "$deb" Version) is not $version-<revision>";; esac
[ "$(dpkg-deb --field "$deb" Architecture)" = "$(dpkg --print-architecture)" ] || fail "Architecture"

# Depends: what the binaries link, by package; each one a real, installable Debian package.
depends=$(dpkg-deb --field "$deb" Depends)
echo "check-deb: Depends: $depends"
names=$(tr ',|' '\n\n' <<<"$depends" | sed 's/(.*//; s/ //g' | sort -u)
for lib in libc6 libssl3 libsqlite3-0 libnghttp2-14 libuv1 libsystemd0 libpq5 libcurl4 libstdc++6 libgcc-s1; do
  grep -qxF "$lib" <<<"$names" || fail "Depends lacks $lib"
done
grep -qi swift <<<"$depends" && fail "Depends names a Swift package: $depends"
for name in $names; do
  apt-cache show "$name" > /dev/null 2>&1 || fail "Depends: $name is not a package apt knows"
done

# The file list, exactly (directories aside).
expected=$(
  printf '%s\n' ./usr/bin/relay-server ./usr/bin/relayctl ./usr/bin/mock-apns \
    ./lib/systemd/system/relay-server.service ./usr/lib/sysusers.d/accessory-relay.conf \
    ./etc/accessory-relay/relay.example.json \
    ./usr/share/accessory-relay/alerts.yml ./usr/share/accessory-relay/relay-dashboard.json \
    ./usr/share/accessory-relay/privileged-port.conf.example \
    ./usr/share/doc/accessory-relay/copyright ./usr/share/doc/accessory-relay/changelog.Debian.gz \
    ./usr/share/doc/accessory-relay/README.md ./usr/share/lintian/overrides/accessory-relay \
    ./usr/share/man/man1/relay-server.1.gz ./usr/share/man/man1/relayctl.1.gz ./usr/share/man/man1/mock-apns.1.gz
  for f in docs/*.md; do echo "./usr/share/doc/accessory-relay/$(basename "$f")"; done
) 
actual=$(dpkg-deb --contents "$deb" | awk '{print $6}' | grep -v '/$')
diff <(sort <<<"$expected") <(sort <<<"$actual") || fail "file list differs (< expected, > in the package)"
owners=$(dpkg-deb --contents "$deb" | awk '{print $2}' | sort -u)
[ "$owners" = root/root ] || fail "files not owned by root:root: $owners"
[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)" = /etc/accessory-relay/relay.example.json ] || fail "conffiles"
control=$(dpkg-deb --ctrl-tarfile "$deb" | tar -t)
for script in postinst prerm postrm; do grep -qx "./$script" <<<"$control" || fail "no $script"; done

# Contents that matter at run time.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb --extract "$deb" "$tmp"
grep -qx 'ExecStart=/usr/bin/relay-server --config /etc/accessory-relay/relay.json' "$tmp/lib/systemd/system/relay-server.service" || fail "unit ExecStart"
grep -qx 'Documentation=file:///usr/share/doc/accessory-relay/operations.md' "$tmp/lib/systemd/system/relay-server.service" || fail "unit Documentation"
grep -q '"/var/lib/accessory-relay/relay.db"' "$tmp/etc/accessory-relay/relay.example.json" || fail "example config's store.path"
for bin in relay-server relayctl mock-apns; do
  linked=$(ldd "$tmp/usr/bin/$bin")
  grep -qi swift <<<"$linked" && fail "$bin links a Swift shared library"
  "$tmp/usr/bin/$bin" --version | grep -E "^$bin $version \(commit ([0-9a-f]{12}(-dirty)?|unknown)\)$" > /dev/null || fail "$bin --version"
done

# lintian: the overrides shipped in the package say why each remaining tag is accepted.
if command -v lintian > /dev/null; then
  # (--show-overrides alters the exit status, so the gate and the report are two runs.)
  out=$(lintian --fail-on error,warning --display-info "$deb" 2>&1 | grep -v 'with root privileges') || true
  lintian --fail-on error,warning --display-info "$deb" > /dev/null 2>&1 || { echo "$out"; fail "lintian"; }
  [ -z "$out" ] || { echo "$out"; fail "lintian reported tags without an override"; }
  lintian --display-info --show-overrides "$deb" 2>/dev/null | grep '^O:' | awk '{print $3}' | sort | uniq -c \
    | awk '{printf "check-deb: lintian: overridden (deploy/debian/lintian-overrides): %s x%s\n", $2, $1}' || true
else
  fail "lintian not installed (make deb-deps)"
fi
echo "check-deb: ok ($deb, $(du -k "$deb" | cut -f1) KiB)"
