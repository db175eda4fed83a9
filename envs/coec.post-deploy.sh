#!/usr/bin/env bash
# Run by Snakemake inside a freshly created envs/coec.yaml environment (`--sdm conda`): install
# the coec package of this repository (editable, no dependencies: coec.yaml pins them), so the
# environment has its own `coec` entry point. The workflow exports COEC_SOURCE (its root folder).
set -euo pipefail
src="${COEC_SOURCE:?COEC_SOURCE (the repository root) is not set; run through the Snakefile}"
python -m pip install --no-deps --no-build-isolation -e "$src"
command -v coec >/dev/null
