#!/bin/sh
# Make a new virtual environment holding exactly one lock: tools/install_lock.sh VENV LOCK
#
# Every environment `make` builds comes through here, and so does the clean install that
# tests/e2e/test_locked_install.py compares with the tests' own, so the two cannot drift apart.
#
# The new environment's bundled pip installs uv from locks/installer.txt (hash-checked), and uv
# installs LOCK with --require-hashes: a file whose SHA-256 the lock does not list, or a dependency
# the lock does not pin, is refused, as pip would refuse it. uv installs the 133 packages of the dev
# lock, bytecode compiled, in about 14 s and 25 CPU-seconds where pip took 82 s and 76
# (docs/development.md). The bytecode is compiled here, as pip does, because it may not be later:
# with PYTHONDONTWRITEBYTECODE set (as on the CI machines) every process would compile every
# module it imports anew. PYTHON names the interpreter (default python3); the environment is
# replaced if it exists. INSTALL_NO_BYTECODE=1 leaves the bytecode out, for an environment that
# is only compared, never run (tests/e2e/test_locked_install.py: about half the install's CPU).
set -eu
venv=$1
lock=$2
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes \
	--requirement "$root/locks/installer.txt"
# uv reads no pip.conf; UV_NO_CONFIG keeps a developer's uv.toml out of it as well.
compile=--compile-bytecode
if [ "${INSTALL_NO_BYTECODE:-}" = 1 ]; then compile=; fi
UV_NO_CONFIG=1 "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --require-hashes \
	$compile --requirement "$lock"
