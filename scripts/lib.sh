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

# node_ensure: Node.js 20 or newer with npm.  A machine may have Node.js
# from another source (its nodejs package then bundles npm, and Debian's npm
# package would conflict with it), so only install when the commands are
# missing.
node_ensure() {
	if command -v node >/dev/null && command -v npm >/dev/null; then
		local major
		major=$(node -p 'process.versions.node.split(".")[0]')
		[ "$major" -ge 20 ] && return 0
		say "Node.js $major is too old: the test suite needs 20 or newer (mongodb driver 7)"
		return 1
	fi
	apt_ensure nodejs npm
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

# build DIR [CONFIGURE-ARGS...]: configures (once) and builds out of tree.
build() {
	local dir=$1; shift
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
