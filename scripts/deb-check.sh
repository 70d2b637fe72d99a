#!/usr/bin/env bash
# scripts/deb-check.sh [PACKAGE.deb] — the package as an operator's server meets it, as root (CI runs it):
# builds it (make deb) unless given one, then checks that
#   - Depends names exactly the packages of the shared libraries the binaries load (ldd), and no
#     library comes from the Swift toolchain;
#   - dpkg -i creates the attestd user and its directories (0700) and installs the unit without
#     enabling or starting it;
#   - attestd --version and attestctl init work as that user, on /var/lib/attestd;
#   - dpkg -r removes the binaries and leaves the user and the data.
# It refuses to run where attestd is installed or /var/lib/attestd exists (an operator's data), and
# removes what it created (user, directories) when it is done.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "deb-check: run as root (it installs and removes a package)" >&2; exit 2; }
if dpkg-query -W -f='${Status}' attestd 2>/dev/null | grep -q "install ok installed" || [ -e /var/lib/attestd ] || [ -e /var/backups/attestd ]; then
  echo "deb-check: attestd is installed here or /var/lib/attestd exists; refusing to touch a real deployment" >&2; exit 2
fi
had_user=no; getent passwd attestd >/dev/null && had_user=yes

deb=${1:-}
if [ -z "$deb" ]; then
  make --no-print-directory deb
  deb=attestd_$(tr -d ' \t\r\n' < VERSION)_$(dpkg --print-architecture).deb
fi
[ -f "$deb" ] || { echo "deb-check: no $deb" >&2; exit 1; }
fail() { echo "deb-check: FAIL: $*" >&2; exit 1; }
cleanup() {
  dpkg -P attestd >/dev/null 2>&1 || true
  rm -rf /var/lib/attestd /var/backups/attestd
  [ "$had_user" = yes ] || userdel attestd >/dev/null 2>&1 || true
  getent group attestd >/dev/null && [ "$had_user" = no ] && groupdel attestd >/dev/null 2>&1 || true
}
trap cleanup EXIT

# Depends against what the binaries load: each library ldd resolves, to the package that ships it.
depends=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed -E 's/^ *//; s/ .*//' | sort -u)
package_of() {  # the package that ships a library, under any of its names (merged /usr)
  local path=$1 real candidate
  real=$(readlink -f "$path")
  for candidate in "$path" "$real" "${real#/usr}" "/usr$path"; do
    dpkg -S "$candidate" 2>/dev/null | head -1 | cut -d: -f1 && return 0
  done
  return 1
}
work=$(mktemp -d); dpkg-deb -x "$deb" "$work"
: > "$work/loaded"
for b in "$work/usr/bin/attestd" "$work/usr/bin/attestctl"; do
  for lib in $(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    path=$(ldd "$b" | awk -v l="$lib" '$1 == l && $3 ~ /^\// { print $3 } $1 ~ ("/" l "$") { print $1 }' | head -1)
    [ -n "$path" ] || fail "$b needs $lib, which ldd does not resolve"
    case "$path" in /opt/swift/*|*libswift*|*libFoundation*|*libdispatch*) fail "$b loads $path from the Swift toolchain";; esac
    package_of "$path" >> "$work/loaded" || fail "no package ships $path ($lib)"
  done
done
loaded=$(sort -u "$work/loaded")
rm -rf "$work"
[ "$depends" = "$loaded" ] || fail "Depends ($(echo $depends)) is not the packages of the libraries the binaries load ($(echo $loaded))"
echo "deb-check: Depends = the libraries' packages: $(echo $depends)"

dpkg -i "$deb" >/dev/null
getent passwd attestd >/dev/null || fail "postinst created no attestd user"
for dir in /var/lib/attestd /var/backups/attestd; do
  [ "$(stat -c '%a %U %G' "$dir")" = "700 attestd attestd" ] || fail "$dir is $(stat -c '%a %U %G' "$dir")"
done
[ -f /usr/lib/systemd/system/attestd.service ] || fail "no unit at /usr/lib/systemd/system/attestd.service"
grep -q '^ExecStart=/usr/bin/attestd serve' /usr/lib/systemd/system/attestd.service || fail "the unit does not start /usr/bin/attestd"
[ ! -e /etc/systemd/system/multi-user.target.wants/attestd.service ] || fail "the package enabled the unit"
if [ -d /run/systemd/system ]; then
  ! systemctl is-active --quiet attestd || fail "the package started attestd"
fi
for file in /usr/share/attestd/nginx/attestd.conf /usr/share/attestd/prometheus/attestd-rules.yml /usr/share/doc/attestd/CHANGELOG.md; do
  [ -f "$file" ] || fail "$file is not installed"
done

as_attestd() { runuser -u attestd -- "$@"; }
version=$(as_attestd /usr/bin/attestd --version) || fail "attestd --version failed"
[[ "$version" == "attestd $(dpkg-deb -f "$deb" Version) (commit "* ]] || fail "attestd --version said: $version"
echo "deb-check: $version"
(cd /var/lib/attestd && as_attestd /usr/bin/attestctl init --db /var/lib/attestd/attestd.sqlite --owner ops@example.com) || fail "attestctl init as attestd failed"
[ "$(stat -c '%a %U' /var/lib/attestd/attestd.key)" = "600 attestd" ] || fail "the secrets key is $(stat -c '%a %U' /var/lib/attestd/attestd.key)"
(cd /var/lib/attestd && as_attestd /usr/bin/attestctl integrations list --db /var/lib/attestd/attestd.sqlite) >/dev/null || fail "attestctl cannot read what init wrote"

dpkg -r attestd >/dev/null
[ ! -e /usr/bin/attestd ] && [ ! -e /usr/bin/attestctl ] || fail "dpkg -r left the binaries"
[ -f /var/lib/attestd/attestd.sqlite ] && [ -f /var/lib/attestd/attestd.key ] || fail "dpkg -r removed the data"
getent passwd attestd >/dev/null || fail "dpkg -r removed the attestd user"
echo "deb-check: $deb installed, ran as attestd (init), removed; the data stayed"
