"""The AMX guard (coec.evaluate.llamacpp.amx): the CPU is read from /proc/cpuinfo (not from
llama.cpp's build line), and llama.cpp's extra CPU buffers are turned off only where the CPU
has AMX and the bindings were built with it, or where the user says so; the build script keys
its wheel cache by the build flags."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from coec.evaluate.llamacpp import amx as amx

REPO = Path(__file__).resolve().parents[2]
SPR = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n\nprocessor\t: 1\n"
ZEN = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve\n"
BUILT_AMX = "CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |"
BUILT_NO_AMX = "CPU : SSE3 = 1 | AVX512 = 1 | REPACK = 1 |"


def test_cpu_flags_are_read_from_cpuinfo():
    assert {"amx_tile", "amx_int8", "avx512f"} <= amx.cpu_flags(SPR)
    assert amx.cpu_has_amx(amx.cpu_flags(SPR))
    assert not amx.cpu_has_amx(amx.cpu_flags(ZEN))
    assert amx.cpu_flags(ARM) == {"fp", "asimd", "sve"} and not amx.cpu_has_amx(amx.cpu_flags(ARM))
    assert amx.cpu_flags("") == set()


def test_this_machines_cpu_matches_proc_cpuinfo():
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    assert amx.cpu_has_amx() == (" amx_tile" in text or " amx_int8" in text)


@pytest.mark.parametrize(
    "mode,cpu_amx,built,keep",
    [
        ("auto", True, BUILT_AMX, False),  # the crash's setting: guard on
        ("auto", True, BUILT_NO_AMX, True),  # the project's build: no AMX kernel to avoid
        ("auto", False, BUILT_AMX, True),  # llama.cpp does not use AMX on a CPU without it
        ("auto", False, BUILT_NO_AMX, True),
        ("on", True, BUILT_AMX, True),
        ("off", False, BUILT_NO_AMX, False),
        (" OFF ", False, BUILT_NO_AMX, False),
    ],
)
def test_extra_buffers_are_kept_unless_amx_cpu_and_amx_build(mode, cpu_amx, built, keep):
    assert amx.keep_extra_buffers(mode, cpu_amx=cpu_amx, system_info=built) is keep


def test_the_environment_variable_sets_the_mode(monkeypatch):
    monkeypatch.setenv(amx.ENV, "off")
    assert amx.keep_extra_buffers(cpu_amx=False, system_info=BUILT_NO_AMX) is False
    monkeypatch.setenv(amx.ENV, "sometimes")
    with pytest.raises(ValueError, match=f"{amx.ENV}='sometimes': expected auto, on or off"):
        amx.keep_extra_buffers(cpu_amx=False, system_info=BUILT_NO_AMX)


def test_extra_buffers_off_sets_the_model_parameter():
    """Within the block the bindings' default model parameters carry use_extra_bufts=False
    (what ``Llama()`` starts from); outside it, llama.cpp's default (True)."""
    lib = pytest.importorskip("llama_cpp.llama_cpp")
    assert lib.llama_model_default_params().use_extra_bufts
    with amx.extra_buffers_off():
        assert not lib.llama_model_default_params().use_extra_bufts
    assert lib.llama_model_default_params().use_extra_bufts


def _install_plan(**env) -> str:
    full = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "COEC_LLAMACPP_AMX")}
    full.update(COEC_SETUP_DRY_RUN="1", **env)
    script = REPO / "scripts" / "install_llamacpp.sh"
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=full, check=True).stdout


def _cache(plan: str) -> str:
    return next(line.split(": ", 1)[1] for line in plan.splitlines() if line.startswith("wheel cache: "))


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the AMX flags apply to x86-64 builds")
def test_build_script_turns_amx_off_and_keys_the_wheel_by_its_flags():
    default, amx_on = _install_plan(), _install_plan(COEC_LLAMACPP_AMX="1")
    cuda = _install_plan(CMAKE_ARGS="-DGGML_CUDA=on")
    assert "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in default and "-mno-amx" not in amx_on
    assert "-DGGML_CUDA=on" in cuda and "-mno-amx-int8" in cuda
    assert all("-DLLAVA_BUILD=OFF" in plan for plan in (default, amx_on, cuda))  # no multimodal library
    assert len({_cache(default), _cache(amx_on), _cache(cuda)}) == 3
    # pip's own cache (keyed by name and version only) is never used for the build or the install
    assert all(line.count("--no-cache-dir") == 1 for line in default.splitlines() if line.startswith("+ "))


def test_setup_takes_llamacpp_and_refuses_other_arguments():
    env = dict(os.environ, COEC_SETUP_DRY_RUN="1")
    setup = str(REPO / "scripts" / "setup.sh")
    out = subprocess.run(["bash", setup, "--llamacpp"], capture_output=True, text=True, env=env, check=True).stdout
    assert out.splitlines()[-1] == "+ bash scripts/install_llamacpp.sh"
    plain = subprocess.run(["bash", setup], capture_output=True, text=True, env=env, check=True).stdout
    assert "install_llamacpp" not in plain
    bad = subprocess.run(["bash", setup, "--llama"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.strip() == "setup.sh: unknown argument --llama (expected --llamacpp)"


def test_the_remedys_test_evaluates_every_quantized_type():
    """tests/integration/test_export_gguf.py evaluates every quantized GGUF type in a child
    process (the AMX crash's test): its list is GGUF_TYPES less f32 and f16, so it holds the
    mixes made by llama.cpp's quantizer (the K-quants and iq4_xs) as well as gguf-py's block types."""
    from coec.export.formats import GGUF_TYPES

    text = (REPO / "tests" / "integration" / "test_export_gguf.py").read_text()
    assert 'QUANTIZED = [t for t in GGUF_TYPES if t not in ("f32", "f16")]' in text
    assert "def test_every_quantized_type_is_evaluated_without_a_crash" in text
    quantized = [t for t in GGUF_TYPES if t not in ("f32", "f16")]
    mixes = {"q6_k", "q5_k_m", "q4_k_m", "iq4_xs", "q3_k_m", "q3_k_s", "q2_k"}
    assert mixes | {"q8_0", "q5_1", "q5_0", "q4_1", "q4_0"} == set(quantized)
