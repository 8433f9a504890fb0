#!/usr/bin/env bash
# `make deb`: accessory-relay_<version>-<revision>_<arch>.deb from release binaries built with the
# Swift runtime linked statically (--static-swift-stdlib: /opt/swift's libraries are no Debian
# packages, so none is left to depend on or to ship). Stages with deploy/install.sh (the same
# files as `make install`, laid out for Debian), adds the maintainer scripts from deploy/debian/,
# computes Depends: with dpkg-shlibdeps from the binaries' real linkage, builds with dpkg-deb as
# root:root without fakeroot, then runs scripts/check-deb.sh (file list, Depends:, lintian).
# Env: BUILT (the release bin dir), VERSION, DEB_REVISION, OUT (default build-deb/).
set -euo pipefail
cd "$(dirname "$0")/.."

: "${BUILT:?BUILT must name the directory holding the release binaries}"
: "${VERSION:?VERSION must be the package version (Sources/BuildInfo/BuildInfo.swift)}"
: "${DEB_REVISION:=1}"
: "${OUT:=build-deb}"
arch=$(dpkg --print-architecture)
full="$VERSION-$DEB_REVISION"
deb="$OUT/accessory-relay_${full}_${arch}.deb"
stage="$OUT/stage"
binaries="relay-server relayctl mock-apns"

# The changelog's newest entry must name this version: bump both together.
top=$(sed -n '1s/^accessory-relay (\([^)]*\)).*/\1/p' deploy/debian/changelog)
[ "$top" = "$full" ] || { echo "error: deploy/debian/changelog's newest entry is $top, the package is $full: add an entry" >&2; exit 1; }
for bin in $binaries; do
  # A binary that needs /opt/swift's shared runtime would not run on the target.
  if ldd "$BUILT/$bin" | grep -q 'libswiftCore'; then
    echo "error: $BUILT/$bin links the shared Swift runtime; build with --static-swift-stdlib" >&2; exit 1
  fi
done

rm -rf "$stage" && mkdir -p "$stage"
PREFIX=/usr DESTDIR="$stage" BUILT="$BUILT" BINARIES="$binaries" \
  UNITDIR=/lib/systemd/system SYSUSERSDIR=/usr/lib/sysusers.d SHAREDIR=/usr/share/accessory-relay \
  deploy/install.sh > /dev/null
# postinst creates the state directory with its owner; dpkg should not own it.
rm -rf "$stage/var"
# Symbols only help a debugger; Swift's metadata lives in sections strip keeps.
for bin in $binaries; do
  strip --strip-unneeded --remove-section=.comment --remove-section=.note "$stage/usr/bin/$bin"
done

doc="$stage/usr/share/doc/accessory-relay"
install -m 0644 deploy/debian/copyright "$doc/copyright"
gzip -9n < deploy/debian/changelog > "$doc/changelog.Debian.gz" && chmod 0644 "$doc/changelog.Debian.gz"
install -d -m 0755 "$stage/usr/share/lintian/overrides"
install -m 0644 deploy/debian/lintian-overrides "$stage/usr/share/lintian/overrides/accessory-relay"
# Manual pages from each binary's own --help and --version (help2man), so they cannot drift.
install -d -m 0755 "$stage/usr/share/man/man1"
SOURCE_DATE_EPOCH=$(date -d "$(sed -n 's/^ -- .*>  //p' deploy/debian/changelog | head -1)" +%s)
export SOURCE_DATE_EPOCH
declare -A summary=([relay-server]="accessory notification relay server (ingest, outbox, APNs delivery)"
                    [relayctl]="operate the accessory notification relay and check its cryptography"
                    [mock-apns]="APNs look-alike for testing the accessory notification relay")
for bin in $binaries; do
  help2man --no-info --section=1 --name="${summary[$bin]}" \
    --include=<(printf '[SEE ALSO]\n/usr/share/doc/accessory-relay/operations.md\n') "$BUILT/$bin" \
    | gzip -9n > "$stage/usr/share/man/man1/$bin.1.gz"
  chmod 0644 "$stage/usr/share/man/man1/$bin.1.gz"
done

install -d -m 0755 "$stage/DEBIAN"
for script in postinst prerm postrm; do install -m 0755 "deploy/debian/$script" "$stage/DEBIAN/"; done
echo /etc/accessory-relay/relay.example.json > "$stage/DEBIAN/conffiles"

# dpkg-shlibdeps wants a debian/control beside it: a throwaway one.
shlib=$(mktemp -d)
trap 'rm -rf "$shlib"' EXIT
mkdir "$shlib/debian"
printf 'Source: accessory-relay\n\nPackage: accessory-relay\nArchitecture: any\n' > "$shlib/debian/control"
depends=$(cd "$shlib" && dpkg-shlibdeps -O $(for b in $binaries; do echo "$OLDPWD/$stage/usr/bin/$b"; done) \
          | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "error: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s/@VERSION@/$full/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$size/" -e "s/@DEPENDS@/$depends/" \
  deploy/debian/control.in > "$stage/DEBIAN/control"
(cd "$stage" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | sort -z | xargs -0 md5sum) > "$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/conffiles" "$stage/DEBIAN/md5sums"

# Reproducible: every mtime is the changelog entry's date.
find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
rm -f "$deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" > /dev/null
echo "built $deb"
scripts/check-deb.sh "$deb"
