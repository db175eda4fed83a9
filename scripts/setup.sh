#!/usr/bin/env bash
# Create ./.venv with the pinned dependencies and the coec package (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0   # CPU build; a bare `torch` would pull CUDA
.venv/bin/python -m pip install -q -r envs/requirements.txt
.venv/bin/python -m pip install -q --no-deps -e .
