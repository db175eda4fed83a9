"""Right-solve variants of COEC on the real layers of a results cell: error, steps, seconds.

    python benchmarks/right_solver.py --cell results/smollm2-135m/enwiki-32x512/rcpu-0.3 \
        --grams results/smollm2-135m/grams/enwiki-32x512 \
        [--holdout results/smollm2-135m/grams/enwiki-16x512-holdout] [--layers 0-29] \
        [--modules o_proj,down_proj] [--variants default,literal,cg,cg2] [--json out.json]

Every variant is the config's COEC (alpha 0.9, 20 rounds, align_lambda 50 on o_proj) with one
change: ``literal`` the paper's literal step (eta_scale raw), ``cg`` conjugate directions
(right_solver cg), ``cg2`` / ``cg5`` conjugate directions with at most 2 / 5 right-solve steps a
round, ``cg2-50`` the same as cg2 with 50 rounds, ``literal-fro`` the literal step with the
unscaled stop (run to convergence: the 100-step cap in most rounds), ``pcg2-g3`` / ``pcg2-n1``
CG at most 2 steps a round with the gram (damping 3, the config's ``coec-pcg``) / newton
(damping 1) preconditioner. Per
variant it prints the mean calibration error (relerr_after), the mean held-out error of the same
weight on a disjoint calibration set (with ``--holdout``), right-solve steps per round and the
seconds of every module together (one thread unless --threads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from coec.compensate import compensate
from coec.compensate.errors import OutputError
from coec.io.artifacts import read_gram_layer
from coec.model.arch import attention_shape, o_proj_columns, pruned_value_proj
from coec.model.load import layer_tensor_names, load_config, read_model_tensors

BASE = {"alpha": 0.9, "max_rounds": 20}
VARIANTS = {
    "default": {},
    "literal": {"eta_scale": "raw"},
    "cg": {"right_solver": "cg"},
    "cg2": {"right_solver": "cg", "max_inner_steps": 2},
    "cg2-50": {"right_solver": "cg", "max_inner_steps": 2, "max_rounds": 50},
    "cg5": {"right_solver": "cg", "max_inner_steps": 5},
    "literal-fro": {"eta_scale": "raw", "delta_norm": "fro"},
    "pcg2-n1": {"right_solver": "cg", "max_inner_steps": 2, "precondition": "newton", "precondition_damping": 1.0},
    "pcg2-g3": {"right_solver": "cg", "max_inner_steps": 2, "precondition": "gram", "precondition_damping": 3.0},
}


def layer_range(s: str) -> list[int]:
    out = []
    for part in s.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", required=True)
    ap.add_argument("--grams", required=True)
    ap.add_argument("--holdout", default=None, help="Gram folder of a disjoint calibration set")
    ap.add_argument("--model", default="resources/models/smollm2-135m")
    ap.add_argument("--layers", default="0-29")
    ap.add_argument("--modules", default="o_proj,down_proj")
    ap.add_argument("--variants", default="default,cg2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = load_config(Path(a.model))
    geom = attention_shape(cfg)
    keep = json.loads((Path(a.cell) / "keep.json").read_text())
    variants = a.variants.split(",")
    rows = {v: [] for v in variants}
    for i in layer_range(a.layers):
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(Path(a.model), [names["o_proj"], names["down_proj"], names["v_proj"]])
        k = keep["layers"][i]
        for module in a.modules.split(","):
            cols = (
                o_proj_columns(k["kv_groups"], geom)
                if module == "o_proj"
                else torch.tensor(k["channels"], dtype=torch.long)
            )
            st = read_gram_layer(a.grams, i, module)
            ho = read_gram_layer(a.holdout, i, module) if a.holdout else None
            extra = {}
            if module == "o_proj":
                extra = {
                    "align_lambda": 50.0,
                    "inputs": {"value_proj": pruned_value_proj(w[names["v_proj"]], k["kv_groups"], geom)},
                }
            W0 = w[names[module]]
            for v in variants:
                t0 = time.perf_counter()
                res = compensate(W0, st["gram"], st["mean"], cols, "coec", **{**BASE, **VARIANTS[v]}, **extra)
                sec = time.perf_counter() - t0
                info = res.info
                row = {
                    "layer": i,
                    "module": module,
                    "relerr": info["relerr_after"],
                    "seconds": sec,
                    "steps": info["inner_steps"],
                    "rounds": info["rounds"],
                    "objective": info["objective_history"][-1],
                }
                if ho is not None:
                    hm = ho["gram"].double() / ho["count"]
                    row["heldout"] = OutputError(W0.double(), 0.5 * (hm + hm.mT), cols, ho["mean"].double(), scale=1.0)(
                        res.weight.double()
                    )
                rows[v].append(row)
            print(
                f"layer {i} {module}: "
                + "  ".join(
                    f"{v} {rows[v][-1]['relerr']:.4f}/{rows[v][-1]['steps'] / max(rows[v][-1]['rounds'], 1):.1f}st"
                    f"/{rows[v][-1]['seconds']:.1f}s"
                    for v in variants
                ),
                flush=True,
            )
    print(f"\n{a.cell}: COEC alpha 0.9, 20 rounds, {a.threads} thread(s); per module type, mean over layers")
    print(
        f"{'variant':<8} {'module':<10} {'relerr':>8} {'held-out':>9} {'objective':>10} {'steps/round':>12} {'seconds':>8}"  # noqa: E501
    )
    for v in variants:
        for module in a.modules.split(","):
            rs = [r for r in rows[v] if r["module"] == module]
            ho = f"{statistics.mean(r['heldout'] for r in rs):9.4f}" if "heldout" in rs[0] else f"{'–':>9}"
            spr = sum(r["steps"] for r in rs) / max(sum(r["rounds"] for r in rs), 1)
            print(
                f"{v:<8} {module:<10} {statistics.mean(r['relerr'] for r in rs):8.4f} {ho} "
                f"{statistics.mean(r['objective'] for r in rs):10.5f} {spr:12.2f} {sum(r['seconds'] for r in rs):8.1f}"
            )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
