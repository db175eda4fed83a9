"""llama.cpp on CPUs with AMX: llama.cpp's AMX matmul segfaults on some of them on the first
evaluation of a quantized (q8_0, q4_*, q5_K, q6_K) GGUF (ggml-org/llama.cpp #20824;
docs/deploy.md "llama.cpp on AMX CPUs").

``scripts/install_llamacpp.sh`` builds llama.cpp without its AMX kernels. For bindings built
some other way, :func:`keep_extra_buffers` is the load-time guard: when this CPU has AMX (read
from /proc/cpuinfo; llama.cpp's own ``AMX_INT8`` line says how it was built, not what the CPU
has) and the bindings were built with AMX, the model is loaded with ``use_extra_bufts=False``
(no AMX buffer, and no CPU repack buffer either, which costs q4/q8 speed).
``COEC_LLAMACPP_EXTRA_BUFTS``: ``auto`` (default), ``on`` (llama.cpp's default, e.g. once
upstream fixes the crash) or ``off``.
"""

from __future__ import annotations

import contextlib
import os

from coec.model.arch.gguf import bindings_system_info, default_model_params

ENV = "COEC_LLAMACPP_EXTRA_BUFTS"


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (the first ``flags``/``Features`` line of /proc/cpuinfo, or of the
    text given); empty where there is none."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_has_amx(flags: set[str] | None = None) -> bool:
    """Whether the CPU reports AMX (``amx_tile`` or ``amx_int8`` in its flags)."""
    flags = cpu_flags() if flags is None else flags
    return bool({"amx_tile", "amx_int8"} & flags)


def built_with_amx(system_info: str) -> bool:
    """Whether llama.cpp was compiled with its AMX kernels (``AMX_INT8 = 1`` in
    ``llama_print_system_info``)."""
    return "AMX_INT8 = 1" in system_info


def keep_extra_buffers(mode: str | None = None, cpu_amx: bool | None = None, system_info: str | None = None) -> bool:
    """Whether to load with llama.cpp's extra CPU buffer types (its default): False under
    ``mode`` 'off', or under 'auto' when the CPU has AMX and the bindings were built with it."""
    mode = (os.environ.get(ENV, "auto") if mode is None else mode).strip().lower()
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"{ENV}={mode!r}: expected auto, on or off")
    if mode != "auto":
        return mode == "on"
    if not (cpu_has_amx() if cpu_amx is None else cpu_amx):
        return True
    return not built_with_amx(bindings_system_info() if system_info is None else system_info)


def extra_buffers_off() -> contextlib.AbstractContextManager[None]:
    """Within the block, llama-cpp-python's ``Llama()`` loads with ``use_extra_bufts=False``."""
    return default_model_params(use_extra_bufts=False)


#: The CPU flags CI prints so that a llama.cpp failure can be tied to the machine
REPORTED_FLAGS = ("amx_tile", "amx_int8", "amx_bf16", "avx512f", "avx512_vnni", "avx2")


def describe() -> str:
    """One line: the CPU's flags from /proc/cpuinfo, and, where the bindings import, how
    llama.cpp was built and whether models load with its extra CPU buffers."""
    flags = cpu_flags()
    line = "CPU (/proc/cpuinfo): " + " ".join(f"{f}={int(f in flags)}" for f in REPORTED_FLAGS)
    try:
        info = bindings_system_info()
    except ImportError:
        return line + " | llama-cpp-python: not installed"
    built = "with" if built_with_amx(info) else "without"
    keep = "on" if keep_extra_buffers() else "off (use_extra_bufts=False)"
    return f"{line} | llama.cpp built {built} AMX kernels | extra CPU buffers: {keep}"


if __name__ == "__main__":
    print(describe())
