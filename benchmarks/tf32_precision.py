#!/usr/bin/env python
"""What TF32 matrix products would do to COEC's errors, emulated on the CPU.

TF32 (CUDA tensor cores, ``torch.set_float32_matmul_precision("high")``) multiplies float32
operands rounded to 10 explicit mantissa bits and accumulates in float32. It is the one large
speed lever left for the right solve on a GPU (whose float32 products otherwise run on the
CUDA cores), and the objective it would touch is a difference of large numbers. This script runs the same
COEC call three times on bench_compensate's synthetic problems: plain float32; with every float32
``mm`` / ``addmm`` / ``bmm`` / ``baddbmm`` seeing operands rounded to TF32 (round to nearest even,
through a ``TorchDispatchMode``; float64 products and the factorisations are untouched, as on
CUDA), which is what the global switch does; and with the option ``direction_matmul: tf32``,
which puts TF32 only inside the right solve's search direction and step size (the Riemannian
gradient's two products and the Rayleigh step's ``g Gxx``), the objective's evaluations and the
retraction staying float32. For that run the option's CUDA-only switch
(``descent.matmul_precision``) is replaced by the emulation and its CUDA check
(``algorithm1_setup.direction_matmul_used``) is told yes, so the library's own scoping is what is measured.
It prints the final calibration and held-out errors, the rounds, the stop reason and how far the
objective history strays. Speed is not emulated: the GPU check times the option on CUDA
(``bench_compensate.py --coec-opts '{"direction_matmul": "tf32"}'``); the global switch is not
timed, since it stops COEC early.

    python benchmarks/tf32_precision.py                    # embedded shapes, 50 rounds
    python benchmarks/tf32_precision.py --widths 1024 --max-rounds 20
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json

import torch
from bench_compensate import DEFAULT_TOKENS, SHAPES, heldout_relerr, synth_problem, width_shapes
from torch.utils._python_dispatch import TorchDispatchMode

from coec.compensate import compensate, descent

setup_module = importlib.import_module("coec.compensate.algorithm1_setup")

_MM = {
    torch.ops.aten.mm.default: (0, 1),
    torch.ops.aten.bmm.default: (0, 1),
    torch.ops.aten.addmm.default: (1, 2),
    torch.ops.aten.baddbmm.default: (1, 2),
}


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 -> the nearest TF32 value (10 explicit mantissa bits, ties to even), as float32."""
    bits = x.contiguous().view(torch.int32)
    lsb = (bits >> 13) & 1
    rounded = (bits + 0x0FFF + lsb) & ~0x1FFF
    keep = ~torch.isfinite(x)  # inf / nan pass through unchanged
    return torch.where(keep, x, rounded.view(torch.float32))


class EmulatedTF32(TorchDispatchMode):
    """Round the float32 operands of every matrix product to TF32 (``count`` products seen)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        slots = _MM.get(func)
        if slots is not None and all(
            isinstance(args[i], torch.Tensor) and args[i].dtype == torch.float32 for i in slots
        ):
            args = list(args)
            for i in slots:
                args[i] = round_tf32(args[i])
            self.count += 1
        return func(*args, **kwargs)


@contextlib.contextmanager
def emulated_direction_option(mode: EmulatedTF32):
    """Make ``direction_matmul: tf32`` act on this CPU as it does on CUDA, with TF32 emulated."""
    saved = descent.matmul_precision, setup_module.direction_matmul_used

    def precision(kind="float32"):
        return mode if kind == "tf32" else contextlib.nullcontext()

    descent.matmul_precision = precision
    setup_module.direction_matmul_used = lambda option, device, dtype: option
    try:
        yield mode
    finally:
        descent.matmul_precision, setup_module.direction_matmul_used = saved


def run_mode(mode: str, *args, **kw):
    """One COEC call in ``mode`` ("float32", "tf32 everywhere", "tf32 direction"); (out, products rounded)."""
    if mode == "float32":
        return compensate(*args, **kw), 0
    mm = EmulatedTF32()
    if mode == "tf32 everywhere":
        with mm:
            return compensate(*args, **kw), mm.count
    with emulated_direction_option(mm):
        out = compensate(*args, direction_matmul="tf32", **kw)
    assert out.info["direction_matmul_used"] == "tf32"
    return out, mm.count


MODES = ("float32", "tf32 everywhere", "tf32 direction")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="embedded", choices=["embedded", "8b"])
    ap.add_argument("--widths", default=None, help="comma list: bench_compensate's Llama-like layer family instead")
    ap.add_argument("--modules", default="o_proj,down_proj")
    ap.add_argument("--max-rounds", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--test-tokens", type=int, default=8192)
    ap.add_argument("--align-lambda", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    shapes = [s for w in a.widths.split(",") for s in width_shapes(int(w))] if a.widths else SHAPES[a.shapes]
    n_tok = a.tokens or (4096 if a.widths else DEFAULT_TOKENS[a.shapes])
    rows = []
    for name, module, d_out, d_in, k, extra in shapes:
        if module not in a.modules.split(","):
            continue
        W0, G, mean, keep, vp, test = synth_problem(
            module, d_out, d_in, k, extra, n_tok, a.seed, torch.device("cpu"), n_test=a.test_tokens
        )
        opts = {"max_rounds": a.max_rounds}
        if module == "o_proj" and a.align_lambda > 0:
            opts.update(align_lambda=a.align_lambda, inputs={"value_proj": vp})
        for mode in MODES:
            out, count = run_mode(mode, W0, G, mean, keep, "coec", **opts)
            i = out.info
            row = {
                "shape": name,
                "mode": mode,
                "relerr_before": i["relerr_before"],
                "relerr_after": i["relerr_after"],
                "heldout": heldout_relerr(out, W0, test, keep, a.test_tokens) if test else None,
                "rounds": i["rounds"],
                "inner_steps": i["inner_steps"],
                "stop": i["stop_reason"],
                "objective_history": i["objective_history"],
                "products_rounded": count,
                "align_after": i.get("align_after"),
            }
            rows.append(row)
            ho = "" if row["heldout"] is None else f" held-out {row['heldout']:.6f}"
            print(
                f"[{name}] {mode:16s} relerr {row['relerr_before']:.6f} -> {row['relerr_after']:.6f}{ho} "
                f"rounds {row['rounds']} steps {row['inner_steps']} stop {row['stop']}"
                + (f" ({count} products rounded)" if count else ""),
                flush=True,
            )
        ref = rows[-len(MODES)]
        for emu in rows[-len(MODES) + 1 :]:
            rel = (emu["relerr_after"] - ref["relerr_after"]) / ref["relerr_after"]
            n = min(len(ref["objective_history"]), len(emu["objective_history"]))
            worst = max(abs(e - f) / abs(f) for e, f in zip(emu["objective_history"][:n], ref["objective_history"][:n]))
            print(
                f"[{name}] {emu['mode']}: final error {1 + rel:.4f}x float32's ({100 * rel:+.2f} %), objective "
                f"history within {worst:.1e} of float32's over its first {n} entries"
            )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
