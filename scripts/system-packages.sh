#!/usr/bin/env bash
# Install the system packages Tether needs when they are missing: bubblewrap (the sandbox every
# agent program runs in), prlimit, slirp4netns and nftables (network egress for instances granted it,
# fenced off this machine). With an argument, also those packages (CI adds chromium).
# Needs root (or sudo) to install; without it, says what to install and fails.
set -eu
want=()
command -v bwrap >/dev/null 2>&1 || want+=(bubblewrap)
command -v prlimit >/dev/null 2>&1 || want+=(util-linux)
command -v slirp4netns >/dev/null 2>&1 || want+=(slirp4netns)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || want+=(nftables)
for extra in "$@"; do
  command -v "$extra" >/dev/null 2>&1 || want+=("$extra")
done
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
  echo "Tether needs these system packages: ${want[*]} (Debian/Ubuntu: apt-get install ${want[*]})" >&2
  exit 1
fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
if ! command -v apt-get >/dev/null 2>&1; then
  echo "Install with your system's package manager: ${want[*]}" >&2
  exit 1
fi
echo "installing system packages: ${want[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${want[@]}" >/dev/null
