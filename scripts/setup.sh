#!/usr/bin/env bash
# Create ./.venv with the pinned dependencies and the coec package (idempotent).
#   COEC_TORCH_INDEX     index to take the pinned torch from, e.g.
#                        https://download.pytorch.org/whl/cpu (CPU build, ~200 MB) or
#                        https://download.pytorch.org/whl/cu128 (CUDA 12.8 build);
#                        unset: pip's configured index (the CPU wheel on these machines; the
#                        CUDA build from the public PyPI on Linux). See docs/setup.md.
#   COEC_SETUP_DRY_RUN=1 print the commands instead of running them.
#   --llamacpp           also build and install llama-cpp-python (the llama.cpp bindings) through
#                        scripts/install_llamacpp.sh: the one install path for users and CI
#                        (without llama.cpp's AMX kernels, wheel cached by its build flags;
#                        docs/deploy.md "llama.cpp on AMX CPUs").
set -euo pipefail
llamacpp=0
for arg in "$@"; do
    case $arg in
        --llamacpp) llamacpp=1 ;;
        *) echo "setup.sh: unknown argument $arg (expected --llamacpp)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=$(grep -E '^torch==' envs/requirements.txt)   # the one torch pin
run() {
    if [ -n "${COEC_SETUP_DRY_RUN:-}" ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}
[ -x .venv/bin/python ] || run "$PY" -m venv .venv
run .venv/bin/python -m pip install -q --upgrade pip
if [ -n "${COEC_TORCH_INDEX:-}" ]; then
    run .venv/bin/python -m pip install -q "$TORCH" --index-url "$COEC_TORCH_INDEX"
else
    run .venv/bin/python -m pip install -q "$TORCH"
fi
run .venv/bin/python -m pip install -q -r envs/requirements.txt
run .venv/bin/python -m pip install -q --no-deps -e .
if [ "$llamacpp" = 1 ]; then
    run bash scripts/install_llamacpp.sh
fi
