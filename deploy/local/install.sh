#!/usr/bin/env bash
# Installs the servers sigwatch's tests, `sigwatch demo`, `sigwatch dev` (make run) and the
# benchmarks start as child processes: redis-server, redis-cli, redis-sentinel, mosquitto and
# mosquitto_passwd, and mosquitto_pub for the README's first device. The demo, `sigwatch dev` and
# the tests embed their own nats-server (the version go.mod pins), so they need none installed.
#
# `sigwatch run` on servers of your own needs Redis 6.2 or newer and nats-server 2.10 or newer with
# JetStream (-js); it checks both at start. Debian's nats-server package is older (2.9): get one with
# `go install github.com/nats-io/nats-server/v2@latest` or the release binaries
# (https://github.com/nats-io/nats-server/releases), or use `make run`, which starts all three.
#
# With --browser (make test) also chromium, the headless browser the status page test drives,
# Debian's old nats-server (/usr/bin/nats-server, 2.9), which a test starts to see `sigwatch run`
# refuse it (nothing else runs that binary), and prometheus-alertmanager, the Alertmanager the
# sink tests start on a loopback port (elsewhere the binary is called alertmanager).
# Safe to run again; prints next to nothing when everything is there.
#
# Works unattended (no stdin, CI=true): apt-get runs non-interactively and sudo is never asked
# for a password.
set -euo pipefail

bins="redis-server redis-cli redis-sentinel mosquitto mosquitto_passwd mosquitto_pub"
pkgs="redis-server redis-sentinel mosquitto mosquitto-clients"
if [ "${1:-}" = "--browser" ]; then
	bins="$bins chromium nats-server prometheus-alertmanager"
	pkgs="$pkgs chromium nats-server prometheus-alertmanager"
fi

# have NAME: NAME is on PATH or in a system binary directory (Debian puts mosquitto in
# /usr/sbin, which is often not on a user's PATH; internal/servers looks there too).
have() {
	command -v "$1" >/dev/null 2>&1 && return 0
	local d
	for d in /usr/sbin /usr/bin /usr/local/sbin /usr/local/bin /opt/homebrew/sbin /opt/homebrew/bin; do
		[ -x "$d/$1" ] && return 0
	done
	return 1
}

missing_bins() {
	local b out=""
	for b in $bins; do
		have "$b" || out="$out $b"
	done
	echo "${out# }"
}

missing=$(missing_bins)
[ -z "$missing" ] && exit 0

echo "deps: missing: $missing"

if command -v apt-get >/dev/null 2>&1; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
			sudo="sudo -n"
		else
			echo "deps: installing needs root. Run as root, or run:" >&2
			echo "  sudo apt-get install -y $pkgs" >&2
			exit 1
		fi
	fi

	# Remember which services exist already, so that only the ones installed now are stopped.
	had_redis=0 had_sentinel=0 had_mosquitto=0 had_nats=0 had_alertmanager=0
	dpkg-query -W -f='${Status}' redis-server 2>/dev/null | grep -q "install ok installed" && had_redis=1
	dpkg-query -W -f='${Status}' redis-sentinel 2>/dev/null | grep -q "install ok installed" && had_sentinel=1
	dpkg-query -W -f='${Status}' mosquitto 2>/dev/null | grep -q "install ok installed" && had_mosquitto=1
	dpkg-query -W -f='${Status}' nats-server 2>/dev/null | grep -q "install ok installed" && had_nats=1
	dpkg-query -W -f='${Status}' prometheus-alertmanager 2>/dev/null | grep -q "install ok installed" && had_alertmanager=1

	echo "deps: apt-get install $pkgs"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
		$pkgs </dev/null >/dev/null

	# The packages start system-wide services on 6379, 26379, 1883, 4222 and 9093. The tests, the demo
	# and `make run` start servers of their own in their own directories, so stop and disable the
	# ones this script installed rather than leave a stray broker and database running (and a
	# nats-server too old for sigwatch on the port `make run` would take). In containers
	# without systemd the packages usually do not start them at all.
	if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
		[ "$had_redis" = 1 ] || $sudo systemctl disable --now redis-server >/dev/null 2>&1 || true
		[ "$had_sentinel" = 1 ] || $sudo systemctl disable --now redis-sentinel >/dev/null 2>&1 || true
		[ "$had_mosquitto" = 1 ] || $sudo systemctl disable --now mosquitto >/dev/null 2>&1 || true
		[ "$had_nats" = 1 ] || $sudo systemctl disable --now nats-server >/dev/null 2>&1 || true
		[ "$had_alertmanager" = 1 ] || $sudo systemctl disable --now prometheus-alertmanager >/dev/null 2>&1 || true
	fi

	missing=$(missing_bins)
	if [ -n "$missing" ]; then
		echo "deps: still missing after apt-get install: $missing" >&2
		exit 1
	fi
	echo "deps: ok"
	exit 0
fi

cat >&2 <<MSG
deps: sigwatch needs $missing, and this script only knows how to install them with apt-get.
Install them with your package manager, then run \`make deps\` again:
(redis-sentinel comes with each redis package below)
  macOS (Homebrew):  brew install redis mosquitto alertmanager && brew install --cask chromium
                     (mosquitto goes to \$(brew --prefix)/sbin, which sigwatch also searches)
  Fedora/RHEL:       sudo dnf install redis mosquitto chromium
  Arch:              sudo pacman -S redis mosquitto chromium
  Alpine:            sudo apk add redis mosquitto chromium
MSG
exit 1
