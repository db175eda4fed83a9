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


MODEL_STAGES = ("calibrate", "select", "compensate", "ppl", "zeroshot", "geometry", "export")
EXPECT_HELP = ('JSON of what the config says of the model, e.g. {"model": "models.tiny", "num_layers": 2, '
               '"seqlen_key": "evaluation.ppl_seqlen"}; checked against its config.json first')


def hub_options(a) -> tuple[str | None, bool]:
    """(revision, trust_remote_code) of a parsed model stage (absent options: None, False)."""
    return getattr(a, "revision", None), bool(getattr(a, "trust_remote_code", False))


def add_hub_args(s: argparse.ArgumentParser) -> None:
    """--revision / --trust-remote-code: passed to every load of the model and tokenizer."""
    s.add_argument("--revision", default=None,
                   help="hub revision (commit, tag or branch) of a hub-id --model")
    s.add_argument("--trust-remote-code", action="store_true",
                   help="allow the model repository's own code (transformers trust_remote_code)")


def check_model_stage(a) -> None:
    """A model stage's model against --expect, its --seqlen and its --keep, before any work
    (``coec.modelcheck``): one error line naming the config key and both values."""
    from .modelcheck import check_stage
    from .models import resolve_model_dir

    model_dir = resolve_model_dir(a.model, *hub_options(a))  # at --revision, as the stage loads it
    check_stage(model_dir, getattr(a, "expect", None), getattr(a, "seqlen", None), getattr(a, "keep", None))


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
    s.add_argument("--method", required=True, help="score: wanda_sp | flap | rcpu")
    s.add_argument("--options", default="{}",
                   help="JSON of score options (weight_norm, activation_scale, group_aggregation); "
                        "{} = the paper's formula")
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
    s.add_argument("--log-samples", action=argparse.BooleanOptionalAction, default=True,
                   help="also save lm-eval's per-sample records (<out stem>_samples/<task>.jsonl)")
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
    s.add_argument("--cell", type=_json, default={}, help="cell labels recorded in config.json")
    s.add_argument("--force", action="store_true",
                   help="replace a previous export in --out (never any other folder)")
    s.add_argument("--out", required=True, help="absent or empty folder (never the source model's)")

    for stage in MODEL_STAGES:  # the workflow's expectations, checked before any work
        sub.choices[stage].add_argument("--expect", type=_json, default={}, help=EXPECT_HELP)
        add_hub_args(sub.choices[stage])

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
    from safetensors import SafetensorError

    t0 = time.time()
    try:
        fn()
    except (ValueError, FileNotFoundError, KeyError, FloatingPointError, SafetensorError) as exc:
        # ArtifactError (a ValueError) reads "<file>: <problem>"; any message is kept to one line
        msg = " ".join(str(exc).split())
        log.error("%s failed: %s", stage, msg)
        print(f"coec {stage}: error: {msg}", file=sys.stderr)
        return 2
    log.info("%s done in %.1fs", stage, time.time() - t0)
    return 0


def _dispatch(a) -> None:
    from . import pipeline as P

    hub = dict(zip(("revision", "trust_remote_code"), hub_options(a)))
    if a.stage in MODEL_STAGES:
        check_model_stage(a)
    if a.stage == "prepare-model":
        P.prepare_model(a.spec, a.name, a.out)
    elif a.stage == "prepare-text":
        from .resources import prepare_embedded_text

        prepare_embedded_text(a.out, a.eval_every)
    elif a.stage == "calibrate":
        P.run_calibrate(a.model, a.dataset, a.out, a.nsamples, a.seqlen, a.seed, a.batch_size,
                        a.dtype, a.device, a.gram_dtype, **hub)
    elif a.stage == "select":
        P.run_select(a.model, a.grams, a.method, a.ratio, a.group_rounding, a.out,
                     options=json.loads(a.options), **hub)
    elif a.stage == "compensate":
        P.run_compensate(a.model, a.grams, a.keep, a.spec, a.first, a.last, a.out, a.device, **hub)
    elif a.stage == "ppl":
        P.run_ppl(a.model, a.dataset, a.seqlen, a.max_windows, a.batch_size, a.dtype, a.device,
                  a.out, a.keep, a.comp, a.cell, a.device_map, **hub)
    elif a.stage == "zeroshot":
        P.run_zeroshot(a.model, a.tasks, a.data_dir, a.limit, a.batch_size, a.max_length,
                       a.dtype, a.device, a.out, a.keep, a.comp, a.cell, a.device_map,
                       log_samples=a.log_samples, **hub)
    elif a.stage == "prepare-zeroshot":
        P.prepare_zeroshot(a.out)
    elif a.stage == "report":
        from .report import write_report

        write_report(a.kind, a.spec, a.out)
    elif a.stage == "geometry":
        P.run_geometry(a.model, a.keep, a.comp, a.out, **hub)
    elif a.stage == "export":
        P.run_export(a.model, a.keep, a.comp, a.dtype, a.out, a.force, a.cell, **hub)


if __name__ == "__main__":
    sys.exit(main())
