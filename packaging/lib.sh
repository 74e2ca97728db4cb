# shellcheck shell=bash
# packaging/lib.sh - shared by packaging/test-deb, build-image and test-image: a clean
# Debian 12 root, made once with debootstrap and kept as a tarball outside the
# repository, so that each run starts from a fresh copy in seconds.  Sourced.

# shellcheck source=../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

RELAYBUS_PKG_CACHE=${RELAYBUS_PKG_CACHE:-/var/tmp/relaybus-pkg}
RELAYBUS_PKG_MIRROR=${RELAYBUS_PKG_MIRROR:-http://deb.debian.org/debian}

# pkg_base_tarball: prints the path of the tarball of a minbase bookworm root,
# made with debootstrap on the first call (a few minutes; the mirror must be
# reachable), and reused afterwards.
pkg_base_tarball() {
	local tarball="$RELAYBUS_PKG_CACHE/bookworm-minbase.tar" tmp
	if [ ! -s "$tarball" ]; then
		mkdir -p "$RELAYBUS_PKG_CACHE"
		tmp=$(mktemp -d "$RELAYBUS_PKG_CACHE/debootstrap.XXXXXX")
		say "debootstrap --variant=minbase bookworm (once; cached as $tarball)"
		if ! nice debootstrap --variant=minbase bookworm "$tmp/root" "$RELAYBUS_PKG_MIRROR" >"$tmp/debootstrap.log" 2>&1; then
			tail -20 "$tmp/debootstrap.log" >&2
			rm -rf "$tmp"
			return 1
		fi
		# Without the downloaded .debs: apt fetches what it needs again.
		rm -f "$tmp"/root/var/cache/apt/archives/*.deb
		tar -C "$tmp/root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
		rm -rf "$tmp"
	fi
	echo "$tarball"
}

# pkg_root_new DIR: unpacks a fresh copy of the base root into DIR (which must
# not exist) and makes it ready for apt: the host's resolv.conf, /proc and
# /dev mounted (pkg_root_umount undoes the mounts).
pkg_root_new() {
	local dir=$1 tarball
	tarball=$(pkg_base_tarball) || return 1
	mkdir -p "$dir" && tar -C "$dir" -xf "$tarball" || return 1
	cp /etc/resolv.conf "$dir/etc/resolv.conf"
	mount -t proc proc "$dir/proc" && mount --bind /dev "$dir/dev"
}

# pkg_root_umount DIR: the mounts of pkg_root_new, if any.
pkg_root_umount() {
	local dir=$1 m
	for m in dev proc; do
		mountpoint -q "$dir/$m" && umount -l "$dir/$m"
	done
	return 0
}
