#!/usr/bin/env bash
# Build and install llama-cpp-python (the llama.cpp bindings) into ./.venv, the one path for users
# and CI (`bash scripts/setup.sh --llamacpp` calls it; docs/deploy.md "llama.cpp on AMX CPUs").
#
# llama-cpp-python ships as a source distribution; pip compiles the llama.cpp it vendors with
# -march=native. On x86-64 this script adds -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 (GCC and
# clang honour an explicit -mno-* over what -march=native turns on), so no AMX kernel is compiled:
# llama.cpp's AMX matmul segfaults on some AMX CPUs (ggml-org/llama.cpp #20824). The built
# libggml-cpu is checked with objdump for AMX tile instructions before the wheel is kept.
#
# The wheel is cached under $COEC_WHEEL_CACHE (default ~/.cache/coec/llamacpp-wheels), in a
# folder keyed by the version, the compiler flags, CMAKE_ARGS, the compiler and this CPU's
# flags (a native build runs only on CPUs like the one that built it). pip's own wheel cache,
# which keys by name and version only, is bypassed (--no-cache-dir), so a wheel built with other
# flags is never picked up.
#   COEC_LLAMACPP_VERSION   the llama-cpp-python release (default 0.3.36)
#   COEC_LLAMACPP_AMX=1     keep llama.cpp's AMX kernels (no -mno-amx-*; once upstream fixes the crash)
#   CMAKE_ARGS              extra cmake arguments, e.g. -DGGML_CUDA=on (part of the cache key)
#   COEC_SETUP_DRY_RUN=1    print the cache key, flags and commands instead of running them
#   COEC_LLAMACPP_WHEEL_ONLY=1  build (or find) the cached wheel and stop: install nothing (CI builds it
#                           while other steps run)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${COEC_LLAMACPP_VERSION:-0.3.36}
PIP=(.venv/bin/python -m pip)
AMX_OFF="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
AMX_MNEMONICS='ldtilecfg|sttilecfg|tileloadd|tileloaddt1|tilestored|tilerelease|tilezero|tdpbssd|tdpbsud|tdpbusd|tdpbuud|tdpbf16ps|tdpfp16ps'

flags=""
if [ "$(uname -m)" = x86_64 ] && [ "${COEC_LLAMACPP_AMX:-0}" != 1 ]; then flags=$AMX_OFF; fi
# no multimodal library (mtmd, the bindings' llava/clip chat handlers, loaded only by them): 209 s
# instead of 264 s for a cold build on 2 idle cores (docs/deploy.md)
cmake_args="-DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}"
if [ -n "$flags" ]; then cmake_args="-DCMAKE_C_FLAGS='$flags' -DCMAKE_CXX_FLAGS='$flags' $cmake_args"; fi
cpu_flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | tr ' ' '\n' | sort | tr '\n' ' ' || true)
compiler=$({ ${CC:-cc} --version 2>/dev/null || echo none; } | head -1)
key=$(printf '%s\n' "llama-cpp-python==$VERSION" "$cmake_args" "$(uname -m)" "$compiler" "$cpu_flags" |
    sha256sum | cut -c1-16)
cache=${COEC_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/coec/llamacpp-wheels}/$VERSION-$key
echo "llama-cpp-python $VERSION: CMAKE_ARGS=$cmake_args"
echo "wheel cache: $cache"
if [ -n "${COEC_SETUP_DRY_RUN:-}" ]; then
    echo "+ CMAKE_ARGS=\"$cmake_args\" ${PIP[*]} wheel --no-deps --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==$VERSION"
    echo "+ ${PIP[*]} install --no-cache-dir --force-reinstall --no-deps $cache/llama_cpp_python-$VERSION-*.whl"
    exit 0
fi
[ -x .venv/bin/python ] || { echo "no .venv: run scripts/setup.sh first" >&2; exit 1; }

# count_amx WHEEL: the AMX tile instructions in the wheel's libggml-cpu (objdump -d)
count_amx() {
    local tmp
    tmp=$(mktemp -d)
    .venv/bin/python -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$1" "$tmp"
    local libs
    libs=$(find "$tmp" -name 'libggml-cpu*.so*' -o -name 'libggml.so*' | sort)
    [ -n "$libs" ] || { echo "no libggml in $1" >&2; rm -rf "$tmp"; return 1; }
    # shellcheck disable=SC2086
    objdump -d --no-show-raw-insn $libs | grep -cwE "$AMX_MNEMONICS" || true
    rm -rf "$tmp"
}

wheel=$(find "$cache" -maxdepth 1 -name "llama_cpp_python-$VERSION-*.whl" 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $VERSION from source (about 4 min on 2 idle cores) ..."
    build=$(mktemp -d)
    CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
        "${PIP[@]}" wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -w "$build"
    wheel=$(find "$build" -name "llama_cpp_python-$VERSION-*.whl" | head -1)
    if [ -n "$flags" ] && command -v objdump >/dev/null; then
        n=$(count_amx "$wheel")
        if [ "$n" != 0 ]; then
            echo "the built llama.cpp has $n AMX tile instructions despite $flags; not installed" >&2
            exit 1
        fi
        echo "objdump: 0 AMX tile instructions in libggml-cpu"
    elif [ -n "$flags" ]; then
        echo "warning: objdump not found; the build's AMX check is skipped" >&2
    fi
    mkdir -p "$(dirname "$cache")"
    rm -rf "$cache.tmp" && mkdir "$cache.tmp" && cp "$wheel" "$cache.tmp/" && mv -T "$cache.tmp" "$cache"
    rm -rf "$build"
    wheel=$(find "$cache" -maxdepth 1 -name "llama_cpp_python-$VERSION-*.whl" | head -1)
else
    echo "reusing $wheel"
fi
if [ -n "${COEC_LLAMACPP_WHEEL_ONLY:-}" ]; then echo "wheel: $wheel (not installed)"; exit 0; fi
"${PIP[@]}" install -q --no-cache-dir --force-reinstall --no-deps "$wheel"
"${PIP[@]}" install -q "$wheel"   # its dependencies (numpy, jinja2, diskcache, typing-extensions)
.venv/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, '|', \
llama_cpp.llama_print_system_info().decode())"
