#!/usr/bin/env bash
# Makes sure this x86-64 machine can build (and, with qemu-user, run) the
# workspace for aarch64 Linux: the rustup target, a cross C compiler with the
# aarch64 libc headers (crates with C build scripts, e.g. onig_sys under
# tokenizers, and the final link) and qemu-aarch64. Installs what is missing
# (rustup, apt-get as root). Exits non-zero, saying what is missing on
# stderr, when they cannot be had.
#
# Prints the environment the cargo commands need, for `eval`:
#   CC_aarch64_unknown_linux_gnu, CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER
#   and, when qemu-aarch64 is there, ..._RUNNER. Set as variables (not a
#   committed .cargo/config) so x86 builds are untouched.
set -euo pipefail
target=aarch64-unknown-linux-gnu
cc=aarch64-linux-gnu-gcc
sysroot=/usr/aarch64-linux-gnu

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  rustup target add "$target" >&2 || { echo "no rustup target $target" >&2; exit 1; }
fi

# gcc-aarch64-linux-gnu alone lacks the libc headers (libc6-dev-arm64-cross):
# onig_sys then fails on bits/libc-header-start.h.
if ! command -v "$cc" >/dev/null || [ ! -e "$sysroot/include/stdio.h" ] || ! command -v qemu-aarch64 >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    pkgs="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $pkgs >&2 ||
      { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends $pkgs >&2; } || true
  fi
fi
command -v "$cc" >/dev/null && [ -e "$sysroot/include/stdio.h" ] ||
  { echo "no $cc with aarch64 libc headers" >&2; exit 1; }

echo "export CC_aarch64_unknown_linux_gnu=$cc"
echo "export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=$cc"
if command -v qemu-aarch64 >/dev/null; then
  echo "export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER='qemu-aarch64 -L $sysroot'"
fi
