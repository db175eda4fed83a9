"""Calibration vs held-out reconstruction error of every compensation on real layers.

    python benchmarks/generalization.py [--model resources/models/smollm2-135m]
        [--text resources/text/enwiki] [--calib 8 --heldout 64 --seqlen 512]
        [--ratio 0.3 --selection rcpu --layers 0,3,...] [--max-rounds 20] [--json out.json]
        [--methods none,bias,lstsq,rcpu,coec] [--coec-opts '{"delta_norm": "fro"}']

Grams of the calibration windows (from calib.txt) and of disjoint held-out windows (from
eval.txt) are taken in one layer-wise pass each; keep sets come from the calibration Grams; each
method compensates from the calibration Grams and is scored on both (relative error, FLAP's bias
included). Also reports, on these real layers, how often GCV picks a grid end and the alignment
penalty reduction on o_proj (paper: median 7.2x).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from coec.calibrate.layer_pass import LayerRun, run_layerwise
from coec.compensate import compensate
from coec.compensate.errors import OutputError
from coec.data.text import load_split, sample_windows, tokenize_text
from coec.model.arch import attention_shape, o_proj_columns, pruned_value_proj
from coec.model.load import load_model
from coec.select.scores import KeepRule, select_layer

METHODS = ("none", "bias", "lstsq", "rcpu", "coec")


def layer_stats(model, ids, batch):
    out = {}

    def keep(i, stats):
        out[i] = {
            m: {"gram": a.gram.cpu(), "sum": a.sum.cpu(), "count": a.count, "mean": (a.sum / a.count).cpu()}
            for m, a in stats.items()
        }

    run_layerwise(model, ids, on_layer=keep, run=LayerRun(batch_size=batch, progress=True))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resources/models/smollm2-135m")
    ap.add_argument("--text", default="resources/text/enwiki")
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--heldout", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ratio", type=float, default=0.3)
    ap.add_argument("--selection", default="rcpu")
    ap.add_argument("--group-rounding", default="nearest")
    ap.add_argument("--layers", default="0,3,6,9,12,15,18,21,24,27")
    ap.add_argument("--max-rounds", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma list of compensation methods")
    ap.add_argument(
        "--coec-opts", type=json.loads, default={}, help='extra coec options as JSON, e.g. \'{"delta_norm": "fro"}\''
    )
    a = ap.parse_args()
    model, tok = load_model(a.model, dtype="float32")
    geom = attention_shape(model.config)
    spec = {"source": "embedded", "dir": a.text}
    calib_ids = sample_windows(tokenize_text(tok, load_split(spec, "calib")), a.calib, a.seqlen, 0)
    held_ids = sample_windows(tokenize_text(tok, load_split(spec, "eval")), a.heldout, a.seqlen, 1)
    t0 = time.time()
    cal, held = layer_stats(model, calib_ids, a.batch), layer_stats(model, held_ids, a.batch)
    print(
        f"statistics: {a.calib} calibration and {a.heldout} held-out sequences x {a.seqlen} "
        f"tokens in {time.time() - t0:.0f}s"
    )
    layers = [int(x) for x in a.layers.split(",")]
    methods = a.methods.split(",")
    sums = {(m, mod): {"calib": [], "held": [], "sec": []} for m in methods for mod in ("o_proj", "down_proj")}
    lambdas, at_end, reductions = [], [0, 0, 0], []
    for i in layers:
        L = model.model.layers[i]
        W = {"o_proj": L.self_attn.o_proj.weight.data, "down_proj": L.mlp.down_proj.weight.data}
        k = select_layer(a.selection, W, cal[i], geom, KeepRule(a.ratio, group_rounding=a.group_rounding))
        cols = {
            "o_proj": o_proj_columns(k["kv_groups"], geom),
            "down_proj": torch.tensor(k["channels"], dtype=torch.long),
        }
        vp = pruned_value_proj(L.self_attn.v_proj.weight.data, k["kv_groups"], geom)
        for mod in ("o_proj", "down_proj"):
            c, h = cal[i][mod], held[i][mod]
            for m in methods:
                opts = {"max_rounds": a.max_rounds, **a.coec_opts} if m == "coec" else {}
                opts["n_tokens"] = c["count"]
                if m == "coec" and mod == "o_proj":
                    opts.update(align_lambda=50.0, inputs={"value_proj": vp})
                t1 = time.time()
                res = compensate(W[mod], c["gram"], c["mean"], cols[mod], m, **opts)
                sec = time.time() - t1
                for name, st in (("calib", c), ("held", h)):
                    err = OutputError(W[mod].double(), st["gram"] / st["count"], cols[mod], st["mean"], scale=1.0)(
                        res.weight.double(), res.bias
                    )
                    sums[(m, mod)][name].append(err)
                sums[(m, mod)]["sec"].append(sec)
                if m == "coec":
                    info = res.info
                    lambdas.extend(info.get("gcv_lambdas_rel", []))
                    ends = info.get("gcv_at_grid_end", {})
                    at_end[0] += ends.get("low", 0)
                    at_end[1] += ends.get("high", 0)
                    at_end[2] += len(info.get("gcv_lambdas", []))
                    pb, pa = info.get("align_before"), info.get("align_after")
                    if pb and pa:
                        reductions.append(pb / pa if pa > 0 else float("inf"))
        print(f"layer {i} done")
    rows = []
    print(
        f"\n{a.selection} selection at {a.ratio}, layers {a.layers}; mean relative error "
        f"(bias included), {a.calib} calibration vs {a.heldout} held-out sequences"
    )
    print("| module | method | calibration | held-out | held-out / calibration | s per module |")
    print("|---|---|---|---|---|---|")
    for (m, mod), v in sums.items():
        c, h, s = statistics.mean(v["calib"]), statistics.mean(v["held"]), statistics.mean(v["sec"])
        rows.append({"module": mod, "method": m, "calib": c, "heldout": h, "seconds": s})
        print(f"| {mod} | {m} | {c:.5f} | {h:.5f} | {h / c:.2f} | {s:.2f} |")
    if lambdas:
        print(
            f"GCV lambda / median(e): median {statistics.median(lambdas):.3g}, "
            f"min {min(lambdas):.3g}, max {max(lambdas):.3g}"
        )
    summary = {
        "rows": rows,
        "gcv_lambda_rel": lambdas,
        "gcv_calls": at_end[2],
        "gcv_bottom": at_end[0],
        "gcv_top": at_end[1],
        "align_reduction_median": statistics.median(reductions) if reductions else None,
        "align_reduction_max": max(reductions) if reductions else None,
        "args": vars(a),
    }
    print(f"\nGCV on real layers: {at_end[2]} calls, {at_end[0]} at the grid bottom, {at_end[1]} at the top")
    if reductions:
        print(
            f"alignment penalty reduction on o_proj (lambda_a 50): median {summary['align_reduction_median']:.2f}x, "
            f"max {summary['align_reduction_max']:.2f}x over {len(reductions)} layers"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
