# scripts/lib.sh - shared by scripts/run and scripts/test: installs what is
# missing and builds the proxy.  Sourced, not executed.

RELAYBUS_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian packages the build and the tests need.
RELAYBUS_BUILD_PACKAGES="build-essential autoconf automake libtool pkg-config
	libevent-dev libbson-dev libmongoc-dev libssl-dev libcurl4-openssl-dev zlib1g-dev libzstd-dev
	libsnappy-dev libidn-dev libcmocka-dev openssl libnats-dev librabbitmq-dev librdkafka-dev"
# What packaging/ needs besides the build packages: the Debian package's build
# and check (debhelper, lintian), the clean Debian root its test installs it
# into (debootstrap), and the OCI image's build and unpacking (umoci, skopeo).
RELAYBUS_PACKAGING_PACKAGES="debhelper lintian debootstrap umoci skopeo"
RELAYBUS_TEST_PACKAGES="clang libclang-rt-14-dev valgrind socat prometheus chromium python3-pymongo man-db systemd nats-server rabbitmq-server faketime haproxy"

say() { printf '==> %s\n' "$*" >&2; }

# apt_ensure PKG...: installs the packages that are not installed yet.
apt_ensure() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	local sudo=
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null || { say "need root (or sudo) to install: ${missing[*]}"; return 1; }
		sudo=sudo
	fi
	say "installing Debian packages: ${missing[*]}"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || return 1
	local before rc=0
	before=$(boot_links)
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || rc=$?
	boot_links_restore "$before" $sudo
	return $rc
}

# boot_links: the units enabled at boot, as the symlinks under
# /etc/systemd/system/*.wants/ and *.requires/ (one path a line, sorted).
# This is what enabling writes, with or without a running systemd (Debian's
# postinst scripts call deb-systemd-helper, which makes the links itself
# when systemd is not PID 1), and what `systemctl is-enabled` reads.
boot_links() {
	find /etc/systemd/system -mindepth 2 -maxdepth 2 -type l \( -path '*.wants/*' -o -path '*.requires/*' \) 2>/dev/null | sort
}

# boot_links_restore BEFORE [SUDO]: disables the units that an install
# enabled, i.e. whose links are in boot_links now but not in BEFORE.  The
# packages the tests need (rabbitmq-server and its epmd, nats-server,
# prometheus) enable themselves at boot; a test run must not leave them
# so.  Units enabled before are left as they were.
boot_links_restore() {
	local before=$1 sudo=${2:-} new unit
	new=$(comm -13 <(printf '%s\n' "$before") <(boot_links))
	[ -n "$new" ] || return 0
	if [ -d /run/systemd/system ]; then
		# systemd runs: let it remove every link of each unit (Also=, aliases).
		for unit in $(printf '%s\n' "$new" | xargs -n1 basename | sort -u); do
			say "disabling $unit (enabled at boot by its package's install)"
			$sudo systemctl disable --quiet "$unit" >&2 || say "could not disable $unit"
		done
	else
		printf '%s\n' "$new" | while IFS= read -r link; do
			say "removing $link (enabled at boot by its package's install)"
			$sudo rm -f -- "$link"
		done
	fi
}

# The Node.js the test suite and the server double need: the mongodb driver
# 7, bson 7 and mongoose 9 of tests/package.json require 20.19 or later.
RELAYBUS_NODE_MIN=20.19
# Where node_ensure puts a Node.js of its own when the machine's is older (or
# missing): Debian 12 ships 18.20.  It comes from the npm registry, as the
# package node-linux-<arch> (the official build: bin/node and the headers
# that native modules compile against), at this version and checksum.
# With it, npm from the registry too (the version Node.js 20 ships): Debian's
# npm builds native modules against Debian's libnode, which crashes them in
# another Node.js, while this one's node-gyp builds them against
# include/node.  Debian's npm (on Debian's node) only fetches the two.
RELAYBUS_NODE_DIR="$RELAYBUS_TOP/build-node"
RELAYBUS_NODE_VERSION=20.20.2
declare -A RELAYBUS_NODE_INTEGRITY=(
	[x64]=sha512-PeHQM8wAdmHtZA1mBocygZxs5LiUWtsJezQTkBd0iY987KpGrD1O2tVEydvMZiuXceRanxt7rjTnDEBwOPujoQ==
	[arm64]=sha512-LCXJnNTFiyGuYBw2gZSI5OBFMbkjAPt8sqD/NKrWoE2QmDgSubTqFng6GaNJ9EJ8HpxBMGcWWpbbcs4Vo+CnGg==
)
RELAYBUS_NPM_VERSION=10.8.2
RELAYBUS_NPM_INTEGRITY=sha512-x/AIjFIKRllrhcb48dqUNAAZl0ig9+qMuN91RpZo3Cb2+zuibfh+KISl6+kVVyktDz230JKc208UkQwwMqyB+w==

# node_version_ok [NODE]: whether NODE (default: node on PATH) runs and is
# RELAYBUS_NODE_MIN or later.
node_version_ok() {
	local node=${1:-node}
	"$node" -e '
		const [a, b] = process.argv[1].split(".").map(Number);
		const [x, y] = process.versions.node.split(".").map(Number);
		process.exit(x > a || (x === a && y >= b) ? 0 : 1);' "$RELAYBUS_NODE_MIN" 2>/dev/null
}

# npm_fetch DIR NAME VERSION INTEGRITY: NAME@VERSION's tarball from the npm
# registry into DIR (npm pack), checked against INTEGRITY; prints its path.
npm_fetch() {
	local dir=$1 name=$2 version=$3 want=$4 tgz got
	(cd "$dir" && npm pack --silent "$name@$version" >/dev/null) || { say "npm pack $name@$version failed"; return 1; }
	tgz="$dir/$name-$version.tgz"
	got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
	[ "$got" = "$want" ] || { say "$name@$version: checksum $got is not the expected one"; return 1; }
	echo "$tgz"
}

# node_local_install: puts node-linux-<arch>@RELAYBUS_NODE_VERSION (its
# bin/node and include/node) and npm@RELAYBUS_NPM_VERSION from the npm
# registry into RELAYBUS_NODE_DIR, fetched with the machine's npm.
node_local_install() {
	local arch tmp tgz npm_tgz
	case "$(uname -m)" in
	x86_64) arch=x64 ;;
	aarch64) arch=arm64 ;;
	*) say "no Node.js $RELAYBUS_NODE_MIN or later here, and none to fetch for $(uname -m): install one"; return 1 ;;
	esac
	say "Node.js $(node --version 2>/dev/null || echo "(none)") is older than $RELAYBUS_NODE_MIN (the mongodb driver 7 needs it):"
	say "installing Node.js $RELAYBUS_NODE_VERSION and npm $RELAYBUS_NPM_VERSION from the npm registry into ${RELAYBUS_NODE_DIR#$RELAYBUS_TOP/}/"
	tmp=$(mktemp -d) || return 1
	if tgz=$(npm_fetch "$tmp" "node-linux-$arch" "$RELAYBUS_NODE_VERSION" "${RELAYBUS_NODE_INTEGRITY[$arch]}") \
		&& npm_tgz=$(npm_fetch "$tmp" npm "$RELAYBUS_NPM_VERSION" "$RELAYBUS_NPM_INTEGRITY") \
		&& rm -rf "$RELAYBUS_NODE_DIR" && mkdir -p "$RELAYBUS_NODE_DIR/lib/node_modules/npm" \
		&& tar -C "$RELAYBUS_NODE_DIR" --strip-components=1 -xzf "$tgz" package/bin package/include \
		&& tar -C "$RELAYBUS_NODE_DIR/lib/node_modules/npm" --strip-components=1 -xzf "$npm_tgz" \
		&& ln -s ../lib/node_modules/npm/bin/npm-cli.js "$RELAYBUS_NODE_DIR/bin/npm" \
		&& ln -s ../lib/node_modules/npm/bin/npx-cli.js "$RELAYBUS_NODE_DIR/bin/npx"; then
		rm -rf "$tmp"
		node_version_ok "$RELAYBUS_NODE_DIR/bin/node"
	else
		rm -rf "$tmp" "$RELAYBUS_NODE_DIR"
		return 1
	fi
}

# node_ensure: Node.js RELAYBUS_NODE_MIN or later, and npm, on PATH.  The
# machine's node when it is recent enough; otherwise the one of
# RELAYBUS_NODE_DIR (installed the first time) with its npm, put first on
# PATH, with npm_config_nodedir naming its headers so that native modules
# build for it.
# A machine may have Node.js from another source (its nodejs package then
# bundles npm, and Debian's npm package would conflict with it), so Debian's
# nodejs and npm are only installed when the commands are missing.
node_ensure() {
	if node_version_ok && command -v npm >/dev/null; then
		return 0
	fi
	if [ -x "$RELAYBUS_NODE_DIR/bin/npm" ] && node_version_ok "$RELAYBUS_NODE_DIR/bin/node"; then
		:
	else
		if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
			apt_ensure nodejs npm openssl ca-certificates || return 1
		fi
		node_local_install || return 1
	fi
	export PATH="$RELAYBUS_NODE_DIR/bin:$PATH"
	export npm_config_nodedir="$RELAYBUS_NODE_DIR"
	say "using Node.js $(node --version) of ${RELAYBUS_NODE_DIR#$RELAYBUS_TOP/}/ (put $RELAYBUS_NODE_DIR/bin first on PATH to use it yourself)"
}

# npm_ensure: the Node.js packages of tests/ (server double, drivers), from
# the lock file.
npm_ensure() {
	node_ensure || return 1
	local stamp="$RELAYBUS_TOP/tests/node_modules/.relaybus-stamp"
	if [ -f "$stamp" ] && [ "$stamp" -nt "$RELAYBUS_TOP/tests/package-lock.json" ]; then
		return 0
	fi
	say "installing npm packages of tests/ (npm ci)"
	(cd "$RELAYBUS_TOP/tests" && npm ci --no-audit --no-fund --loglevel=error >&2) || return 1
	touch "$stamp"
}

# run_config SAMPLE LISTEN UPSTREAM: prints SAMPLE (the commented sample ini)
# with [proxy]'s listen and upstream set to LISTEN and UPSTREAM, each exactly
# as given.  The values are written with printf, never put into a sed
# replacement, where '&', '|' and '\' of a URI's options would be read as
# sed's own syntax.  The config parser takes a value as the rest of the line,
# so a value with a line break cannot be written: it is refused.  A '${'
# is written as '$${', so that the proxy takes it as it is.
run_config() {
	local sample=$1 listen=$2 upstream=$3 line
	case "$listen$upstream" in
	*$'\n'* | *$'\r'*) say "a listen address or upstream URI with a line break cannot be written to the config"; return 1 ;;
	esac
	# The config reads ${NAME} as an environment variable and $${ as a
	# literal ${ (docs/configuration.md, Secrets).
	listen=${listen//'${'/'$${'}
	upstream=${upstream//'${'/'$${'}
	while IFS= read -r line || [ -n "$line" ]; do
		case "$line" in
		"listen = 127.0.0.1:27018") printf 'listen = %s\n' "$listen" ;;
		"upstream = "*) printf 'upstream = %s\n' "$upstream" ;;
		*) printf '%s\n' "$line" ;;
		esac
	done <"$sample"
}

# configured_in_place: whether ./configure ran in the source folder itself
# (README.md's build by hand).  configure then refuses an out-of-tree build
# ("source directory already configured"), and make there would mix the
# folder's objects into it.
configured_in_place() { [ -f "$RELAYBUS_TOP/config.status" ]; }

# build DIR [CONFIGURE-ARGS...]: configures (once) and builds out of tree.
build() {
	local dir=$1; shift
	if configured_in_place; then
		say "the source folder is configured in place (./configure ran there): ${dir#$RELAYBUS_TOP/}/ cannot be built beside it"
		say "run 'make distclean' at the top of the clone first (scripts/run uses the build in place as it is)"
		return 1
	fi
	if [ ! -x "$RELAYBUS_TOP/configure" ] || [ "$RELAYBUS_TOP/configure.ac" -nt "$RELAYBUS_TOP/configure" ] \
		|| [ "$RELAYBUS_TOP/Makefile.am" -nt "$RELAYBUS_TOP/Makefile.in" ]; then
		say "autoreconf"
		(cd "$RELAYBUS_TOP" && autoreconf -fi >&2) || return 1
	fi
	mkdir -p "$dir"
	if [ ! -f "$dir/Makefile" ] || [ "$RELAYBUS_TOP/configure" -nt "$dir/Makefile" ]; then
		say "configure $* (in ${dir#$RELAYBUS_TOP/})"
		(cd "$dir" && "$RELAYBUS_TOP/configure" "$@" >"$dir/configure.out" 2>&1) \
			|| { cat "$dir/configure.out" >&2; return 1; }
	fi
	say "make (in ${dir#$RELAYBUS_TOP/})"
	make -C "$dir" -j"$(nproc)" >&2
}
