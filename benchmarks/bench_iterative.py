"""Wall time of iterative FLAP (S steps) against one-pass FLAP and a plain calibration pass.

    python benchmarks/bench_iterative.py [--model resources/models/smollm2-135m]
        [--nseq 4 --seqlen 256 --batch 4 --steps 3 --ratio 0.5 --dtype float32 --device cpu]

Prints the seconds of: one calibration pass (``calibrate.run_layerwise``), one-pass FLAP (S = 1:
pass + scores + bias + surgery), S-step iterative FLAP, one layer-sequential step, and the ratios
S-step / one-pass FLAP and S-step / calibration pass (goal: <= S + 1). Each pruning run starts
from a freshly loaded model (load time not counted). Calibration text: the embedded Wikipedia
text when built, else random token ids.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from coec.calibrate.layer_pass import LayerRun, run_layerwise
from coec.iterative.method import Options, run_iterative
from coec.iterative.schedule import make_schedule
from coec.iterative.stats import CalibSet, calib_set
from coec.model.load import load_model, resolve_device


def calib_for(tok, args) -> CalibSet:
    text = Path(args.text)
    if text.is_file():
        ds = {"source": "files", "calib": str(text)}
        return calib_set(tok, [{"name": "text", "alpha": 1.0, "dataset": ds}], args.nseq, args.seqlen, 0)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tok), (args.nseq, args.seqlen), generator=gen)
    return CalibSet(ids, torch.zeros(args.nseq, dtype=torch.long), ["random"], [1.0], [args.nseq])


def timed_prune(args, calib, schedule, **opts) -> tuple[float, list[dict]]:
    model, _ = load_model(args.model, dtype=args.dtype, device="cpu")
    o = Options(
        batch_size=args.batch, device=resolve_device(args.device), progress=False, group_rounding="nearest", **opts
    )
    t0 = time.perf_counter()
    _, infos = run_iterative(model, calib, schedule, o)
    return time.perf_counter() - t0, infos


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resources/models/smollm2-135m")
    ap.add_argument("--text", default="resources/text/enwiki/calib.txt")
    ap.add_argument("--nseq", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.manual_seed(0)

    model, tok = load_model(args.model, dtype=args.dtype, device="cpu")
    calib = calib_for(tok, args)
    t0 = time.perf_counter()
    run_layerwise(
        model, calib.ids, run=LayerRun(batch_size=args.batch, device=resolve_device(args.device), progress=False)
    )
    t_cal = time.perf_counter() - t0
    del model

    t_flap, _ = timed_prune(args, calib, [args.ratio])
    sched = make_schedule(args.ratio, steps=args.steps)
    t_iter, infos = timed_prune(args, calib, sched)
    t_seq, _ = timed_prune(args, calib, [args.ratio], mode="sequential")
    t_alam, _ = timed_prune(args, calib, [args.ratio], structure="al-am")
    S = args.steps
    print(
        f"model {args.model}  tokens {calib.ids.numel()} ({args.nseq}x{args.seqlen}, batch "
        f"{args.batch}, {args.dtype}, {args.device})  ratio {args.ratio}"
    )
    print(f"calibration pass              {t_cal:8.2f} s")
    print(f"one-pass FLAP (S=1)           {t_flap:8.2f} s   = {t_flap / t_cal:.2f} passes")
    print(
        f"iterative FLAP (S={S})          {t_iter:8.2f} s   = {t_iter / t_cal:.2f} passes "
        f"(goal <= {S + 1}),  {t_iter / t_flap:.2f} x one-pass FLAP"
    )
    print("  per step (pass / total s):  " + ", ".join(f"{i['seconds_pass']:.2f}/{i['seconds']:.2f}" for i in infos))
    print(f"layer-sequential (1 step)     {t_seq:8.2f} s   = {t_seq / t_cal:.2f} passes")
    print(f"AL-AM (1 step)                {t_alam:8.2f} s   = {t_alam / t_cal:.2f} passes")


if __name__ == "__main__":
    main()
