#!/usr/bin/env bash
# `make deb-install-test`: installs the built package into a throwaway Debian 12 root (debootstrap
# --variant=minbase, needs deb.debian.org) with apt, as an operator would, and checks what the
# maintainer scripts did: the user and state directory, the unit enabled, the binaries running
# without /opt/swift, relay-server serving relay_build_info as the service user beside mock-apns,
# an upgrade keeping an edited conffile, remove (unit masked, config and data kept) and purge
# (enablement gone; relay.json, keys, the database and the user kept). No systemd runs in the
# root, so starts and stops through systemctl are not exercised. Takes about a minute.
# Usage: scripts/deb-install-test.sh [package.deb] (default: the current version's).
# Env: ROOT (default: a new temp dir, removed afterwards; an existing root is reused and kept).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^ *public static let version = "\(.*\)"$/\1/p' Sources/BuildInfo/BuildInfo.swift)
deb=${1:-build-deb/accessory-relay_${version}-1_$(dpkg --print-architecture).deb}
[ -f "$deb" ] || { echo "error: $deb not built (make deb)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "error: needs root (debootstrap, chroot)" >&2; exit 1; }
root=${ROOT:-$(mktemp -d /tmp/deb-install-test.XXXXXX)}
chmod 0755 "$root"  # mktemp's 0700 would keep the service user out of its own /
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  umount "$root/proc" 2>/dev/null || true
  [ -n "${ROOT:-}" ] || rm -rf "$root"
}
trap cleanup EXIT
fail() { echo "deb-install-test: FAIL: $*" >&2; exit 1; }
in_root() { chroot "$root" /bin/sh -c "$1"; }
as_service() { chroot --userspec=accessory-relay:accessory-relay "$root" "$@"; }

[ -x "$root/usr/bin/apt-get" ] || debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian > /dev/null
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
cp "$deb" "$root/tmp/pkg.deb"
in_root 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /tmp/pkg.deb' > "$root/tmp/install.log" 2>&1 \
  || { tail -20 "$root/tmp/install.log"; fail "apt install"; }
[ ! -e "$root/opt/swift" ] || fail "the root has a Swift toolchain"

in_root 'getent passwd accessory-relay' | grep -q ':/var/lib/accessory-relay:/usr/sbin/nologin$' || fail "service user"
[ "$(in_root "stat -c '%U:%G %a' /var/lib/accessory-relay")" = "accessory-relay:accessory-relay 700" ] || fail "state directory"
[ -L "$root/etc/systemd/system/multi-user.target.wants/relay-server.service" ] || fail "unit not enabled"
for bin in relay-server relayctl mock-apns; do
  in_root "$bin --version" | grep -q "^$bin $version " || fail "$bin --version in the root"
done

# The relay as the service user, against mock-apns, with the layout the docs describe.
openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out "$root/tmp/apns.p8" 2>/dev/null
in_root 'install -d -o root -g accessory-relay -m 0750 /etc/accessory-relay/keys &&
         install -o root -g accessory-relay -m 0640 /tmp/apns.p8 /etc/accessory-relay/keys/'
ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
read -r apns ingest admin <<<"$ports"
cat > "$root/etc/accessory-relay/relay.json" <<JSON
{"listen":{"host":"127.0.0.1","port":$ingest},"admin":{"host":"127.0.0.1","port":$admin},
 "store":{"path":"/var/lib/accessory-relay/relay.db"},
 "apps":[{"bundleID":"com.example.companion","environment":"custom","url":"https://127.0.0.1:$apns","caFile":"/tmp/ca.pem",
   "token":{"p8Path":"/etc/accessory-relay/keys/apns.p8","keyID":"ABCDE12345","teamID":"TEAM123456"}}]}
JSON
in_root 'chown root:accessory-relay /etc/accessory-relay/relay.json && chmod 0640 /etc/accessory-relay/relay.json'
chroot "$root" mock-apns --listen "127.0.0.1:$apns" --generate-tls --ca-out /tmp/ca.pem --bundle-id com.example.companion \
  > "$root/tmp/mock.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -s "$root/tmp/ca.pem" ] && break; sleep 0.1; done
chmod 0644 "$root/tmp/ca.pem"
as_service relayctl check-config --skip-ports > /dev/null || fail "relayctl check-config as the service user"
# chroot itself in the background (not the function: $! would be a subshell, not the relay).
chroot --userspec=accessory-relay:accessory-relay "$root" relay-server --config /etc/accessory-relay/relay.json \
  > "$root/tmp/relay.log" 2>&1 &
pids+=($!)
metrics=""
for _ in $(seq 100); do metrics=$(curl -fsS "http://127.0.0.1:$admin/metrics" 2>/dev/null) && break; sleep 0.1; done
grep -q "^relay_build_info{version=\"$version\",commit=\"[0-9a-f]\{12\}\(-dirty\)\?\"} 1$" <<<"$metrics" \
  || { cat "$root/tmp/relay.log"; fail "relay_build_info on /metrics"; }
grep -q '"msg":"relay-server starting","version"' "$root/tmp/relay.log" || fail "start log line"
as_service relayctl status --json > /dev/null || fail "relayctl status as the service user"
for pid in "${pids[@]}"; do kill "$pid"; wait "$pid" 2>/dev/null || true; done
pids=()

# Upgrade (the same package again): an edited conffile stays, and so does the enablement.
echo '# edited' >> "$root/etc/accessory-relay/relay.example.json"
in_root 'dpkg -i /tmp/pkg.deb' > /dev/null || fail "upgrade"
tail -1 "$root/etc/accessory-relay/relay.example.json" | grep -qx '# edited' || fail "edited conffile replaced"
[ -L "$root/etc/systemd/system/multi-user.target.wants/relay-server.service" ] || fail "enablement lost on upgrade"

in_root 'apt-get remove -y -qq accessory-relay' > /dev/null || fail "remove"
[ ! -e "$root/usr/bin/relay-server" ] || fail "binary left after remove"
[ "$(readlink "$root/etc/systemd/system/relay-server.service")" = /dev/null ] || fail "unit not masked after remove"
[ -f "$root/etc/accessory-relay/relay.json" ] && [ -f "$root/var/lib/accessory-relay/relay.db" ] || fail "config or data lost on remove"

in_root 'dpkg --purge accessory-relay' > /dev/null 2>&1 || fail "purge"
[ ! -e "$root/etc/accessory-relay/relay.example.json" ] || fail "conffile left after purge"
[ ! -e "$root/etc/systemd/system/multi-user.target.wants/relay-server.service" ] || fail "enablement left after purge"
[ ! -L "$root/etc/systemd/system/relay-server.service" ] || fail "mask left after purge"
[ -f "$root/etc/accessory-relay/relay.json" ] && [ -f "$root/var/lib/accessory-relay/relay.db" ] || fail "relay.json or the database removed by purge"
in_root 'getent passwd accessory-relay' > /dev/null || fail "user removed by purge"
echo "deb-install-test: ok ($deb in a Debian 12 minbase root: install, run, upgrade, remove, purge)"
