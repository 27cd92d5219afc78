#!/usr/bin/env bash
# Rehearse a workshop's offline set-up: download every wheel once (with network), then install into a
# fresh venv with no index at all, and run the doctor. Prints how long each part took.
#
#   bash scripts/offline_install.sh [WHEELHOUSE]      (default: ./wheelhouse)
#
# The wheels are for this machine's platform and python3's minor version, with that Python's lock
# (constraints/py3.X.txt). Hand the wheelhouse folder (and this repository) to learners with the same Python
# minor on a USB stick; on their laptop (3.11 shown):
#   python3 -m venv .venv && .venv/bin/pip install --no-index --find-links wheelhouse -c constraints/py3.11.txt -e ".[test,accelerate]"
set -euo pipefail
cd "$(dirname "$0")/.."
wheelhouse=$(realpath -m "${1:-wheelhouse}")
venv=$(mktemp -d)/venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
lock=$(python3 -c 'import sys; sys.path.insert(0, "commhooks_lab"); import install_paths; print(install_paths.lock_for(sys.version_info))')
echo "python3 is $(python3 -V | cut -d' ' -f2): $lock"

start=$(date +%s)
python3 -m pip download -q -c "$lock" -d "$wheelhouse" ".[test,accelerate]" setuptools wheel
python3 -m pip wheel -q --no-deps --no-build-isolation -w "$wheelhouse" . 2>/dev/null || true
downloaded=$(date +%s)

python3 -m venv "$venv"
# No index, no find-links but the wheelhouse: anything missing from it fails here, not at the workshop.
PIP_CONFIG_FILE=/dev/null PIP_CONSTRAINT= PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= \
    "$venv/bin/pip" install -q --no-index --find-links "$wheelhouse" -c "$lock" -e ".[test,accelerate]"
installed=$(date +%s)

"$venv/bin/python" -m commhooks_lab doctor
checked=$(date +%s)

echo
echo "wheelhouse: $wheelhouse ($(du -sh "$wheelhouse" | cut -f1), $(ls "$wheelhouse" | wc -l) files)"
echo "download $((downloaded - start)) s, offline install $((installed - downloaded)) s, doctor $((checked - installed)) s"
rm -rf "$(dirname "$venv")"
