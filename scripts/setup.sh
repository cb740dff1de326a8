#!/usr/bin/env bash
# Creates .venv beside this repo with the pinned CPU toolchain (constraints/ci.txt) and installs
# megakernel into it in editable mode; `setup.sh test` adds the test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" -r constraints/ci.txt
extras=""
[ "${1:-}" = "test" ] && extras="[test]"
"${pip[@]}" -c constraints/ci.txt -e ".${extras}"
