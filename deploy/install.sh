#!/usr/bin/env bash
# `make install`: binaries, systemd unit, sysusers entry, example config, docs, state directory.
# scripts/build-deb.sh stages the Debian package with it too (the knobs below).
# PREFIX/DESTDIR aware for packaging; /etc/accessory-relay and /var/lib/accessory-relay are fixed
# because the unit's ConfigurationDirectory=/StateDirectory= put them there.
# With an empty DESTDIR and root, it also creates the service user and owns the state directory.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${PREFIX:=/usr/local}"
: "${DESTDIR:=}"
: "${BINDIR:=$PREFIX/bin}"
: "${UNITDIR:=$PREFIX/lib/systemd/system}"
: "${SYSUSERSDIR:=$PREFIX/lib/sysusers.d}"
: "${DOCDIR:=$PREFIX/share/doc/accessory-relay}"
# Alert rules, dashboard and the low-port drop-in example (the Debian package: /usr/share/accessory-relay).
: "${SHAREDIR:=$DOCDIR/examples}"
# mock-apns is left out of `make install` (a test tool); the package ships it.
: "${BINARIES:=relay-server relayctl}"
: "${BUILT:?BUILT must name the directory holding the built relay-server and relayctl}"
CONFDIR=/etc/accessory-relay
STATEDIR=/var/lib/accessory-relay
SERVICE_USER=accessory-relay

for bin in $BINARIES; do
  [ -x "$BUILT/$bin" ] || { echo "error: $BUILT/$bin not built (run 'make release')" >&2; exit 1; }
done
[ -f config/relay.example.json ] || { echo "error: config/relay.example.json missing" >&2; exit 1; }

install -d -m 0755 "$DESTDIR$BINDIR" "$DESTDIR$UNITDIR" "$DESTDIR$SYSUSERSDIR" "$DESTDIR$DOCDIR" "$DESTDIR$SHAREDIR"
for bin in $BINARIES; do install -m 0755 "$BUILT/$bin" "$DESTDIR$BINDIR/"; done

# The checked-in unit says /usr/local; point it at where the binaries and docs really go.
sed -e "s#/usr/local/bin/#$BINDIR/#g" -e "s#/usr/local/share/doc/accessory-relay#$DOCDIR#g" \
  deploy/systemd/relay-server.service > "$DESTDIR$UNITDIR/relay-server.service"
chmod 0644 "$DESTDIR$UNITDIR/relay-server.service"
install -m 0644 deploy/sysusers/accessory-relay.conf "$DESTDIR$SYSUSERSDIR/accessory-relay.conf"

# Config: the example only. relay.json is the operator's (copied from the example and edited),
# never overwritten by an upgrade. The directory stays root-owned (ConfigurationDirectory=).
# The repository's example is written for any directory (relative paths); the installed one
# points at the system layout: the DB in the state directory (the only path the unit lets the
# service write) and keys under $CONFDIR/keys.
install -d -m 0755 "$DESTDIR$CONFDIR"
sed -e 's#"path": "relay.db"#"path": "'"$STATEDIR"'/relay.db"#' \
    -e 's#/etc/relay/tls/#'"$CONFDIR"'/keys/#g' -e 's#/etc/relay/#'"$CONFDIR"'/keys/#g' \
  config/relay.example.json > "$DESTDIR$CONFDIR/relay.example.json"
chmod 0644 "$DESTDIR$CONFDIR/relay.example.json"
grep -q "\"$STATEDIR/relay.db\"" "$DESTDIR$CONFDIR/relay.example.json" \
  || { echo "error: could not point relay.example.json's store.path at $STATEDIR" >&2; exit 1; }

# Docs and monitoring examples beside them.
for f in README.md docs/*.md; do [ -f "$f" ] && install -m 0644 "$f" "$DESTDIR$DOCDIR/"; done
install -m 0644 deploy/systemd/privileged-port.conf.example deploy/prometheus/alerts.yml \
  deploy/grafana/relay-dashboard.json "$DESTDIR$SHAREDIR/"

# State: the DB lives here. systemd would create it too (StateDirectory=); creating it now lets
# relayctl and backups work before the first start.
install -d -m 0700 "$DESTDIR$STATEDIR"

if [ -z "$DESTDIR" ] && [ "$(id -u)" -eq 0 ]; then
  if command -v systemd-sysusers >/dev/null; then
    systemd-sysusers "$SYSUSERSDIR/accessory-relay.conf"
  elif ! id "$SERVICE_USER" >/dev/null 2>&1; then
    useradd --system --home-dir "$STATEDIR" --no-create-home --shell /usr/sbin/nologin "$SERVICE_USER"
  fi
  chown "$SERVICE_USER:$SERVICE_USER" "$STATEDIR"
  [ -d /run/systemd/system ] && systemctl daemon-reload
fi

cat <<NEXT
installed $BINARIES in $DESTDIR$BINDIR, unit in $DESTDIR$UNITDIR.
next (see $DOCDIR/operations.md):
  cp $CONFDIR/relay.example.json $CONFDIR/relay.json   # then edit: apps, keys, listeners
  chown root:$SERVICE_USER $CONFDIR/relay.json && chmod 0640 $CONFDIR/relay.json
  relayctl check-config $CONFDIR/relay.json
  systemctl enable --now relay-server
NEXT
