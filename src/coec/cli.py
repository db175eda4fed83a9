"""Command line: one subcommand per workflow stage (``python -m coec <stage> ...``).

Structured arguments (dataset specs, compensation options) are passed as JSON strings, so a
Snakemake rule forwards its ``params`` verbatim.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time


def _json(s: str):
    try:
        return json.loads(s)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {s!r} ({exc})") from None


def _opt_int(s: str):
    return None if s in ("", "none", "None", "null", "0") else int(s)


def _cell_args(s: argparse.ArgumentParser) -> None:
    """Arguments of the evaluation stages: which model cell to assemble, where, and the output."""
    s.add_argument("--dtype", default="float32")
    s.add_argument("--device", default="auto")
    s.add_argument("--keep", default=None, help="keep.json of a pruned cell (none: dense)")
    s.add_argument("--comp", nargs="*", default=[], help="compensation block files")
    s.add_argument("--cell", type=_json, default={}, help="cell labels recorded in the output")
    s.add_argument("--device-map", default=None, help="e.g. auto: spread a 70B+ model over GPUs")
    s.add_argument("--out", required=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coec", description=__doc__)
    sub = p.add_subparsers(dest="stage", required=True)

    s = sub.add_parser("prepare-model", help="convert an embedded (wheel-shipped) model")
    s.add_argument("--name", required=True)
    s.add_argument("--spec", type=_json, default={})
    s.add_argument("--out", required=True)

    s = sub.add_parser("prepare-text", help="extract the embedded Wikipedia text")
    s.add_argument("--out", required=True)
    s.add_argument("--eval-every", type=int, default=5)

    s = sub.add_parser("calibrate", help="Grams of o_proj/down_proj inputs, layer by layer")
    s.add_argument("--model", required=True)
    s.add_argument("--dataset", type=_json, required=True)
    s.add_argument("--nsamples", type=int, required=True)
    s.add_argument("--seqlen", type=int, required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--dtype", default="float32")
    s.add_argument("--gram-dtype", default="float32")
    s.add_argument("--device", default="auto")
    s.add_argument("--out", required=True)

    s = sub.add_parser("select", help="column scores -> keep.json")
    s.add_argument("--model", required=True)
    s.add_argument("--grams", required=True)
    s.add_argument("--method", required=True)
    s.add_argument("--ratio", type=float, required=True)
    s.add_argument("--group-rounding", default="ceil")
    s.add_argument("--out", required=True)

    s = sub.add_parser("compensate", help="compensate a block of layers")
    s.add_argument("--model", required=True)
    s.add_argument("--grams", required=True)
    s.add_argument("--keep", required=True)
    s.add_argument("--spec", type=_json, required=True)
    s.add_argument("--first", type=int, required=True)
    s.add_argument("--last", type=int, required=True)
    s.add_argument("--device", default="auto")
    s.add_argument("--out", required=True)

    s = sub.add_parser("ppl", help="perplexity of a dense or pruned/compensated model")
    s.add_argument("--model", required=True)
    s.add_argument("--dataset", type=_json, required=True)
    s.add_argument("--seqlen", type=int, required=True)
    s.add_argument("--max-windows", type=_opt_int, default=None)
    s.add_argument("--batch-size", type=int, default=4)
    _cell_args(s)

    s = sub.add_parser("zeroshot", help="lm-eval zero-shot accuracy of a model cell")
    s.add_argument("--model", required=True)
    s.add_argument("--tasks", nargs="+", required=True)
    s.add_argument("--data-dir", default=None)
    s.add_argument("--limit", type=_opt_int, default=None)
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--max-length", type=int, default=2048)
    _cell_args(s)

    s = sub.add_parser("prepare-zeroshot", help="extract the offline zero-shot task data")
    s.add_argument("--out", required=True)

    s = sub.add_parser("report", help="assemble a table from cell results")
    s.add_argument("--kind", required=True)
    s.add_argument("--spec", type=_json, required=True)
    s.add_argument("--out", required=True)

    s = sub.add_parser("geometry", help="App. C measurements of one cell")
    s.add_argument("--model", required=True)
    s.add_argument("--keep", required=True)
    s.add_argument("--comp", nargs="*", default=[])
    s.add_argument("--out", required=True)

    s = sub.add_parser("export", help="write a pruned, compensated HF checkpoint")
    s.add_argument("--model", required=True)
    s.add_argument("--keep", required=True)
    s.add_argument("--comp", nargs="*", default=[])
    s.add_argument("--dtype", default="float32")
    s.add_argument("--out", required=True)

    # listed for --help; `main` hands `iterative ...` to the method's own parser before parsing
    sub.add_parser("iterative", help="iterative multi-domain FLAP (run, grams, mix, prepare-domain, "
                                     "collect, ppl; `coec iterative -h`)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["iterative"]:  # the iterative multi-domain method has its own CLI
        from .iterative import main as iterative_main

        return iterative_main(argv[1:])
    args = build_parser().parse_args(argv)
    return run_guarded(args.stage, lambda: _dispatch(args))


def run_guarded(stage: str, fn) -> int:
    """Run one stage with logging; a bad input ends it with one error line and exit code 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    log = logging.getLogger("coec")
    t0 = time.time()
    try:
        fn()
    except (ValueError, FileNotFoundError, KeyError, FloatingPointError) as exc:
        log.error("%s failed: %s", stage, exc)
        print(f"coec {stage}: error: {exc}", file=sys.stderr)
        return 2
    log.info("%s done in %.1fs", stage, time.time() - t0)
    return 0


def _dispatch(a) -> None:
    from . import pipeline as P

    if a.stage == "prepare-model":
        P.prepare_model(a.spec, a.name, a.out)
    elif a.stage == "prepare-text":
        from .resources import prepare_embedded_text

        prepare_embedded_text(a.out, a.eval_every)
    elif a.stage == "calibrate":
        P.run_calibrate(a.model, a.dataset, a.out, a.nsamples, a.seqlen, a.seed, a.batch_size,
                        a.dtype, a.device, a.gram_dtype)
    elif a.stage == "select":
        P.run_select(a.model, a.grams, a.method, a.ratio, a.group_rounding, a.out)
    elif a.stage == "compensate":
        P.run_compensate(a.model, a.grams, a.keep, a.spec, a.first, a.last, a.out, a.device)
    elif a.stage == "ppl":
        P.run_ppl(a.model, a.dataset, a.seqlen, a.max_windows, a.batch_size, a.dtype, a.device,
                  a.out, a.keep, a.comp, a.cell, a.device_map)
    elif a.stage == "zeroshot":
        P.run_zeroshot(a.model, a.tasks, a.data_dir, a.limit, a.batch_size, a.max_length,
                       a.dtype, a.device, a.out, a.keep, a.comp, a.cell, a.device_map)
    elif a.stage == "prepare-zeroshot":
        P.prepare_zeroshot(a.out)
    elif a.stage == "report":
        from .report import write_report

        write_report(a.kind, a.spec, a.out)
    elif a.stage == "geometry":
        P.run_geometry(a.model, a.keep, a.comp, a.out)
    elif a.stage == "export":
        P.run_export(a.model, a.keep, a.comp, a.dtype, a.out)


if __name__ == "__main__":
    sys.exit(main())
