#!/usr/bin/env bash
# scripts/make-deb.sh VERSION BIN_DIR — attestd_VERSION_amd64.deb in the repository's root (make deb).
#   files:   `make install PREFIX=/usr` staged (the binaries without debug information): /usr/bin/attestd and attestctl (the Swift runtime linked
#            in), the systemd unit in /usr/lib/systemd/system, nginx, certbot and Prometheus files in
#            /usr/share/attestd, CHANGELOG.md and the deploying guide in /usr/share/doc/attestd;
#   Depends: exactly the packages of the shared libraries the two binaries name (dpkg-shlibdeps);
#   postinst: the attestd system user, /var/lib/attestd and /var/backups/attestd (0700, its own); the
#            unit is installed, never enabled or started (the operator does that: docs/deploying.md);
#   prerm:   on removal, stops the service if it runs; postrm leaves the user and the data, even on purge.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: make-deb.sh VERSION BIN_DIR}
bin=${2:?usage: make-deb.sh VERSION BIN_DIR}
arch=$(dpkg --print-architecture)
name=attestd_${version}_${arch}
stage=.build/deb/$name
rm -rf "$stage" && mkdir -p "$stage/DEBIAN"
make --no-print-directory install PREFIX=/usr DESTDIR="$PWD/$stage" DIST_BIN="$bin" >/dev/null
# Without the DWARF debug information; the symbol table stays, so
# a crash's backtrace still names its functions.
strip --strip-debug "$stage/usr/bin/attestd" "$stage/usr/bin/attestctl"

# dpkg-shlibdeps reads a debian/control of a source package; it gets a minimal one of its own.
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debian" && printf 'Source: attestd\n\nPackage: attestd\nArchitecture: any\n' > "$work/debian/control"
depends=$(cd "$work" && dpkg-shlibdeps -O -e"$OLDPWD/$stage/usr/bin/attestd" -e"$OLDPWD/$stage/usr/bin/attestctl" 2>/dev/null \
          | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "make-deb: dpkg-shlibdeps named no dependencies" >&2; exit 1; }

cat > "$stage/DEBIAN/control" <<CONTROL
Package: attestd
Version: $version
Architecture: $arch
Maintainer: App Attest token service <attestd@localhost>
Section: net
Priority: optional
Depends: $depends
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Description: App Attest token service for apps that call Claude
 attestd exchanges Apple App Attest proofs from iPhone and Mac apps for short-lived
 access tokens and relays their Messages API requests; attestctl administers it.
 The systemd unit is installed but neither enabled nor started: see
 /usr/share/doc/attestd/deploying.md.
CONTROL

cat > "$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent passwd attestd >/dev/null; then
        useradd --system --user-group --home-dir /var/lib/attestd --no-create-home --shell /usr/sbin/nologin attestd
    fi
    for dir in /var/lib/attestd /var/backups/attestd; do
        install -d -m 0700 -o attestd -g attestd "$dir"
    done
    # The unit is new or changed: systemd reads it again. It is neither enabled nor started here.
    if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
fi
POSTINST

cat > "$stage/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
# Removal (not an upgrade, which the operator stops and starts: docs/deploying.md): stop the service.
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop attestd.service >/dev/null 2>&1 || true
fi
PRERM

cat > "$stage/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
# The attestd user, /var/lib/attestd (the database and the secrets key) and /var/backups/attestd
# stay, even on purge: they hold what the deployment cannot get back. Remove them by hand.
if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
POSTRM
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"

dpkg-deb --root-owner-group -Zxz --build "$stage" "$name.deb" >/dev/null
echo "$name.deb: Depends: $depends"
