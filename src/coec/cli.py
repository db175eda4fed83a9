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

GGUF_TYPES = ("f32", "f16", "q8_0")  # coec.gguf.GGUF_TYPES (not imported: the CLI loads lazily)


def _json(s: str):
    try:
        return json.loads(s)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {s!r} ({exc})") from None


def _opt_int(s: str):
    return None if s in ("", "none", "None", "null", "0") else int(s)


def config_arg(s: argparse.ArgumentParser, flag: str, key: str, **kw) -> argparse.Action:
    """An option whose default is the config schema's default of ``key`` (``coec.config.
    schema_default``), so a stage run by hand and the same stage run by the workflow agree.
    The action records ``config_key`` (tests/test_cli_defaults.py checks every option the rules
    pass is required, has one, or defaults to nothing)."""
    from .config import schema_default

    action = s.add_argument(flag, default=schema_default(key), **kw)
    action.config_key = key
    if action.help is None:
        action.help = f"default: config {key} = {action.default!r}"
    return action


def _cell_args(s: argparse.ArgumentParser) -> None:
    """Arguments of the evaluation stages: which model cell to assemble, where, and the output."""
    config_arg(s, "--dtype", "models.*.dtype")
    config_arg(s, "--device", "compute.device")
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
    config_arg(s, "--eval-every", "datasets.*.eval_every", type=int)

    s = sub.add_parser("calibrate", help="Grams of o_proj/down_proj inputs, layer by layer")
    s.add_argument("--model", required=True)
    s.add_argument("--dataset", type=_json, required=True)
    s.add_argument("--nsamples", type=int, required=True)
    s.add_argument("--seqlen", type=int, required=True)
    config_arg(s, "--seed", "calibration.*.seed", type=int)
    config_arg(s, "--batch-size", "calibration.*.batch_size", type=int)
    config_arg(s, "--dtype", "models.*.dtype")
    config_arg(s, "--gram-dtype", "calibration.*.gram_dtype")
    config_arg(s, "--device", "compute.device")
    s.add_argument("--out", required=True)

    s = sub.add_parser("select", help="column scores -> keep.json")
    s.add_argument("--model", required=True)
    s.add_argument("--grams", required=True)
    s.add_argument("--method", required=True, help="score: wanda_sp | flap | rcpu")
    s.add_argument("--options", default="{}",
                   help="JSON of score options (weight_norm, activation_scale, group_aggregation); "
                        "{} = the paper's formula")
    s.add_argument("--ratio", type=float, required=True)
    config_arg(s, "--group-rounding", "group_rounding")
    s.add_argument("--out", required=True)

    s = sub.add_parser("compensate", help="compensate a block of layers")
    s.add_argument("--model", required=True)
    s.add_argument("--grams", required=True)
    s.add_argument("--keep", required=True)
    s.add_argument("--spec", type=_json, required=True)
    s.add_argument("--first", type=int, required=True)
    s.add_argument("--last", type=int, required=True)
    config_arg(s, "--device", "compute.device")
    s.add_argument("--out", required=True)

    s = sub.add_parser("ppl", help="perplexity of a dense or pruned/compensated model")
    s.add_argument("--model", required=True)
    s.add_argument("--dataset", type=_json, required=True)
    s.add_argument("--seqlen", type=int, required=True)
    s.add_argument("--max-windows", type=_opt_int, default=None)
    config_arg(s, "--batch-size", "evaluation.ppl_batch_size", type=int)
    _cell_args(s)

    s = sub.add_parser("zeroshot", help="lm-eval zero-shot accuracy of a model cell")
    s.add_argument("--model", required=True)
    s.add_argument("--tasks", nargs="+", required=True)
    s.add_argument("--data-dir", default=None)
    s.add_argument("--limit", type=_opt_int, default=None)
    config_arg(s, "--batch-size", "evaluation.zeroshot_batch_size", type=int)
    config_arg(s, "--max-length", "evaluation.zeroshot_max_length", type=int)
    config_arg(s, "--log-samples", "evaluation.zeroshot_log_samples", action=argparse.BooleanOptionalAction,
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

    s = sub.add_parser("export", help="write a pruned, compensated HF checkpoint or GGUF file")
    s.add_argument("--model", required=True)
    s.add_argument("--keep", required=True)
    s.add_argument("--comp", nargs="*", default=[])
    config_arg(s, "--dtype", "models.*.dtype")
    s.add_argument("--cell", type=_json, default={}, help="cell labels recorded in config.json")
    s.add_argument("--force", action="store_true",
                   help="replace a previous export in --out (never any other folder or file)")
    s.add_argument("--format", default="hf", choices=("hf", "gguf"),
                   help="hf: a transformers checkpoint folder; gguf: one file for llama.cpp")
    s.add_argument("--gguf-type", default=None, choices=GGUF_TYPES,
                   help="GGUF tensor type (default f32); q8_0 falls back to f16 per tensor "
                        "where a row width is not a multiple of 32")
    s.add_argument("--tokenizer-gguf", default=None,
                   help="GGUF file whose tokenizer keys are copied (e.g. an embedded model's)")
    s.add_argument("--out", required=True,
                   help="hf: absent or empty folder; gguf: a file name (never inside the source model)")

    for stage in MODEL_STAGES:  # the workflow's expectations, checked before any work
        sub.choices[stage].add_argument("--expect", type=_json, default={}, help=EXPECT_HELP)
        add_hub_args(sub.choices[stage])
    from .streaming.options import STAGE_OPTIONS, add_stream_args

    for stage in STAGE_OPTIONS:  # layer-by-layer streaming (docs/streaming.md)
        add_stream_args(sub.choices[stage], stage)

    add_iterative_parser(sub)
    return p


ITERATIVE_MODEL_STAGES = ("run", "grams", "ppl")


def _calib_args(s: argparse.ArgumentParser) -> None:
    """Arguments of the iterative stages that run a calibration pass (run, grams)."""
    from .iterative import VARIANCE_MIXES

    s.add_argument("--model", required=True)
    s.add_argument("--domains", type=_json, required=True,
                   help='JSON list of {"name", "alpha", "dataset": <data.load_split spec>}')
    s.add_argument("--nsamples", type=int, required=True, help="sequences over all domains")
    s.add_argument("--seqlen", type=int, required=True)
    config_arg(s, "--seed", "iterative.mixes.*.seed", type=int)
    config_arg(s, "--batch-size", "iterative.mixes.*.batch_size", type=int)
    config_arg(s, "--dtype", "models.*.dtype")
    config_arg(s, "--gram-dtype", "iterative.mixes.*.gram_dtype")
    config_arg(s, "--variance-mix", "iterative.mixes.*.variance_mix", choices=VARIANCE_MIXES)
    config_arg(s, "--device", "compute.device")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.add_argument("--expect", type=_json, default={}, help=EXPECT_HELP)
    add_hub_args(s)
    s.add_argument("--out", required=True)


def add_iterative_parser(sub) -> None:
    """``coec iterative <run|grams|mix|prepare-domain|collect|ppl>``: the stages of the
    iterative multi-domain FLAP method (``coec.stages_iterative``)."""
    from .iterative import MODES, STRUCTURES, VARIANCE_MIXES
    from .select import ROUNDINGS

    it = sub.add_parser("iterative", help="iterative multi-domain FLAP (run, grams, mix, "
                                          "prepare-domain, collect, ppl; `coec iterative -h`)",
                        description="Iterative multi-domain FLAP (docs/iterative.md, eq. 1–14).")
    cmds = it.add_subparsers(dest="cmd", required=True)

    s = cmds.add_parser("run", help="iterative (multi-domain) FLAP -> keep.json + bias block")
    _calib_args(s)
    s.add_argument("--ratio", type=float, help="target ratio rho (with --steps or --step)")
    s.add_argument("--steps", type=int, help="S steps: rho_s = rho s / S")
    s.add_argument("--step", type=float, help="step δ of the original width: δ, 2δ, ... rho")
    s.add_argument("--schedule", help="explicit cumulative ratios, e.g. 0.1,0.2,0.3")
    config_arg(s, "--mode", "iterative.variants.*.mode", choices=MODES)
    config_arg(s, "--structure", "iterative.variants.*.structure", choices=STRUCTURES)
    config_arg(s, "--group-rounding", "group_rounding", choices=ROUNDINGS)
    s.add_argument("--channel-rounding", default="ceil", choices=ROUNDINGS)
    s.add_argument("--init", default=None, help="continue from a previous step's output folder")
    s.add_argument("--block-name", default=None, help="default block0-{L-1}.safetensors")

    s = cmds.add_parser("grams", help="multi-domain Gram directory (one pass, mixed by alpha)")
    _calib_args(s)

    s = cmds.add_parser("mix", help="mix per-domain Gram directories (eq. 8)")
    s.add_argument("--grams", nargs="+", required=True)
    s.add_argument("--alphas", nargs="+", type=float, required=True)
    config_arg(s, "--variance-mix", "iterative.mixes.*.variance_mix", choices=VARIANCE_MIXES)
    config_arg(s, "--gram-dtype", "iterative.mixes.*.gram_dtype")
    s.add_argument("--out", required=True)

    s = cmds.add_parser("prepare-domain", help="write a domain's calibration text")
    s.add_argument("--spec", type=_json, required=True)
    s.add_argument("--datasets", type=_json, default={})
    s.add_argument("--out", required=True)

    s = cmds.add_parser("collect", help="assemble a cell from its step folders")
    s.add_argument("--steps", nargs="*", default=[], help="the steps' iterative.json, in order")
    s.add_argument("--variant", type=_json, default={})
    s.add_argument("--keep-out")
    s.add_argument("--info-out")
    s.add_argument("--block", help="a step's bias block file to copy")
    s.add_argument("--first", type=int, default=0)
    s.add_argument("--last", type=int)
    s.add_argument("--block-out")

    s = cmds.add_parser("ppl", help="perplexity of a cell (per-layer widths may differ)")
    s.add_argument("--model", required=True)
    s.add_argument("--dataset", type=_json, required=True)
    s.add_argument("--seqlen", type=int, required=True)
    s.add_argument("--max-windows", type=_opt_int, default=None)
    config_arg(s, "--batch-size", "evaluation.ppl_batch_size", type=int)
    config_arg(s, "--dtype", "models.*.dtype")
    config_arg(s, "--device", "compute.device")
    s.add_argument("--keep", default=None)
    s.add_argument("--comp", nargs="*", default=[])
    s.add_argument("--cell", type=_json, default={})
    s.add_argument("--expect", type=_json, default={}, help=EXPECT_HELP)
    add_hub_args(s)
    s.add_argument("--out", required=True)


def schedule_args_error(a) -> str | None:
    """What is wrong with the schedule options of ``iterative run`` (None: nothing)."""
    given = sum(x is not None for x in (a.steps, a.step)) + bool(a.schedule)
    if a.schedule and (a.steps is not None or a.step is not None):
        return "--schedule excludes --steps/--step"
    if not a.schedule and (a.ratio is None or given != 1):
        return "give --ratio with exactly one of --steps or --step, or --schedule"
    return None


def iterative_schedule(a) -> list[float]:
    """The cumulative ratios of ``iterative run``: --schedule, or --ratio with exactly one of
    --steps / --step (``iterative.make_schedule``)."""
    from .iterative import make_schedule

    return ([float(x) for x in a.schedule.split(",")] if a.schedule
            else make_schedule(a.ratio, a.steps, a.step))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = build_parser()
    args = p.parse_args(argv)
    if args.stage == "export" and args.format == "hf" and (args.gguf_type or args.tokenizer_gguf):
        p.error("export: --gguf-type and --tokenizer-gguf need --format gguf")
    if args.stage == "iterative":
        if args.cmd == "run" and schedule_args_error(args):
            p.error(f"iterative run: {schedule_args_error(args)}")
        return run_guarded(f"iterative {args.cmd}", lambda: _dispatch_iterative(args))
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

    from .streaming.options import stream_options

    hub = dict(zip(("revision", "trust_remote_code"), hub_options(a)))
    hub.update(stream_options(a))  # calibrate, ppl, zeroshot: the streaming options
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
        P.run_export(a.model, a.keep, a.comp, a.dtype, a.out, a.force, a.cell, **hub,
                     fmt=a.format, gguf_type=a.gguf_type or "f32", tokenizer_gguf=a.tokenizer_gguf)


def _dispatch_iterative(a) -> None:
    """Run one ``coec iterative <cmd>`` (``coec.stages_iterative``)."""
    from . import stages_iterative as S

    hub = dict(zip(("revision", "trust_remote_code"), hub_options(a)))
    if a.cmd in ITERATIVE_MODEL_STAGES:  # the model against the config, before any work
        check_model_stage(a)
    if a.cmd in ("run", "grams"):
        calib = dict(seed=a.seed, batch_size=a.batch_size, dtype=a.dtype, gram_dtype=a.gram_dtype,
                     variance_mix=a.variance_mix, device=a.device, progress=not a.quiet, **hub)
    if a.cmd == "run":
        S.run_iterative_prune(a.model, a.domains, a.nsamples, a.seqlen, iterative_schedule(a),
                              a.out, mode=a.mode, structure=a.structure,
                              group_rounding=a.group_rounding, channel_rounding=a.channel_rounding,
                              init=a.init, block_name=a.block_name, **calib)
    elif a.cmd == "grams":
        S.run_iterative_grams(a.model, a.domains, a.nsamples, a.seqlen, a.out, **calib)
    elif a.cmd == "mix":
        S.mix_gram_dirs(a.grams, a.alphas, a.out, a.variance_mix, a.gram_dtype)
    elif a.cmd == "collect":
        if a.steps:
            S.collect_cell(a.steps, a.variant, a.keep_out, a.info_out)
        if a.block:
            S.copy_block(a.block, a.first, a.last, a.block_out)
    elif a.cmd == "prepare-domain":
        S.prepare_domain(a.spec, a.out, a.datasets)
    elif a.cmd == "ppl":  # per-layer widths may differ (AL-AM): build_model prunes them as they are
        from .pipeline import run_ppl

        run_ppl(a.model, a.dataset, a.seqlen, a.max_windows, a.batch_size, a.dtype, a.device,
                a.out, a.keep, a.comp, a.cell, **hub)


if __name__ == "__main__":
    sys.exit(main())
