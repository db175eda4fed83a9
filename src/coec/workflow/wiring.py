"""What the rules wire, as functions of the validated config and a job's wildcards: the files a
job reads beyond its upstream rules' outputs, its params (every value that changes its output),
its resources and threads. The rules (``workflow/rules/*.smk``) only name these; every default
comes from the config schema (the config is validated and filled before a ``Wiring`` is made).
The tables, figures and reports call their spec functions (``coec.workflow.targets``) with
``W.config`` themselves.

    W = Wiring(config)
    rule select:  input: model=W.model_input ...  params: expect=W.expect ...
    rule table4:  input: lambda wc: targets.table4_inputs(W.config) ...
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from shlex import quote as shlex_quote
from typing import Any

from coec.compensate.inputs import Job
from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions
from coec.compensate.options import resolve, top_level_options
from coec.config.modelcheck import local_model_type
from coec.config.validate import ConfigError
from coec.evaluate.tasks import TASKS
from coec.export.formats import split_gguf_variant
from coec.io import paths
from coec.io.paths import NAME, RATIO_PATTERN
from coec.io.provenance import planned_identity
from coec.iterative import targets as iterative_targets
from coec.model.arch import ADAPTERS
from coec.registry import plugin_sha256
from coec.select.scores import SCORES, selection_registry
from coec.select.search import SEARCH
from coec.select.widths import selection_width, width_args
from coec.workflow.resources import JobResources
from coec.workflow.targets import (
    base_cells,
    dataset_spec,
    fig2_calibrations,
    gram_check_input,
    method_inputs,
    model_path,
)


def coec_command(deployment_methods: Any, executable: str = sys.executable) -> str:
    """The command rules run: the `coec` entry point of the environment a job runs in. Under
    `--sdm conda` that is the rule's conda env (envs/coec.yaml, on PATH once activated); else the
    one next to the interpreter running Snakemake, by absolute path (so `.venv/bin/snakemake`
    works without an activated venv), or `<python> -m coec` where no entry point is installed."""
    if "conda" in {str(getattr(m, "name", m)).lower() for m in deployment_methods}:
        return "coec"
    script = os.path.join(os.path.dirname(executable), "coec")
    if os.access(script, os.X_OK):
        return shlex_quote(script)
    return f"{shlex_quote(executable)} -m coec"


def planned_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config the rules plan with: the validated config (never changed itself) and the
    calibration sets and mixes the calibration-size figures resize (``<base>-n<N>``: Fig. 2's,
    ``coec.workflow.targets.fig2_calibrations``; the iterative figure's, ``size_calibrations``), each added
    after the configured ones unless the config names it already."""
    it_calibs, it_mixes = iterative_targets.size_calibrations(config)
    calibration = dict(config["calibration"])
    for extra in (fig2_calibrations(config), it_calibs):
        for name, entry in extra.items():
            calibration.setdefault(name, entry)
    out = dict(config, calibration=calibration)
    if it_mixes:
        mixes = dict(iterative_targets.mix_entries(config))
        for name, entry in it_mixes.items():
            mixes.setdefault(name, entry)
        out["iterative"] = dict(config["iterative"], mixes=mixes)
    return out


class _NoPlugins:
    """The ``plugins`` param of a job that no plug-in's code reaches: not a plain value, so
    Snakemake leaves it out of the params it records and compares (such a job's params are
    exactly those of a config without plug-ins)."""

    def __repr__(self) -> str:
        return "no plug-ins"


NO_PLUGINS = _NoPlugins()


class Wiring(JobResources):
    """The wiring of one validated config (``coec.config.validate.validate_config``): the rules read the
    config only through it. ``config`` is :func:`planned_config` of it (the resized calibration
    sets added); the validated config is never changed."""

    def __init__(self, config: dict[str, Any]):
        self.config = planned_config(config)
        self.evaluation = self.config["evaluation"]
        self.selections = selection_registry(self.config.get("selections"))
        #: --device of every stage, --group-rounding of the select and iterative jobs
        self.device: str = self.config["compute"]["device"]
        self.group_rounding: str = self.config["group_rounding"]
        self._identity: dict[str, dict[str, Any]] = {}
        self._plugin_sha: dict[str, str] = {}
        # what planning evaluates once: each compensation's options (checked by validate_config),
        # each compensate job's method inputs, each cell's Gram check, the base cells
        self._comp_options: dict[str, CommonOptions] = {}
        self._method_inputs: dict[tuple[str, ...], dict[str, str]] = {}
        self._gram_check: dict[tuple[str, str, str], list[str]] = {}
        self._base_cells: list[tuple[str, str]] | None = None

    def wildcard_constraints(self) -> dict[str, str]:
        """The workflow-wide wildcard constraints: a config name (``coec.io.paths.NAME``) for
        model, calibration and compensation; a selection of the registry; a ratio as in paths
        (``coec.io.paths.RATIO_PATTERN``); a layer index."""
        select = "|".join(re.escape(n) for n in sorted(self.selections, key=len, reverse=True))
        layer = r"[0-9]+"
        return dict(model=NAME, calib=NAME, select=select, ratio=RATIO_PATTERN, comp=NAME, first=layer, last=layer)

    def select_constraint(self, search: bool) -> str:
        """The ``select`` wildcard of the search rule (``search``: the width searches, ``score:
        search``, whose keep.json the search job writes) or of the select rule (every other
        selection)."""
        names = [n for n, s in self.selections.items() if (s.score == SEARCH) == search]
        return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) or "(?!)"

    def table_constraint(self) -> str:
        """The ``table`` wildcard of the generic table rule: table1-3 and the config's extra tables."""
        extra = self.config.get("extra_tables") or {}
        return r"table[123]|" + "|".join(re.escape(n) for n in extra) if extra else r"table[123]|table_none"

    # ------------------------------------------------------------------------- models and data
    def model(self, name: str) -> dict[str, Any]:
        """A ``models`` entry."""
        entry: dict[str, Any] = self.config["models"][name]
        return entry

    def model_path(self, wc: Any) -> str:
        """What the CLI loads: the converted folder of an embedded model, else its hub id / folder."""
        return model_path(self.config, wc.model)

    def model_dtype(self, wc: Any) -> str:
        return str(self.model(wc.model)["dtype"])

    def hub(self, wc: Any) -> str:
        """--revision / --trust-remote-code of a model's config, each word shell-quoted; empty when
        neither is set."""
        m = self.model(wc.model)
        args = ["--revision", shlex_quote(str(m["revision"]))] if m.get("revision") else []
        return " ".join(args + (["--trust-remote-code"] if m.get("trust_remote_code") else []))

    def identity(self, model: str) -> dict[str, Any]:
        """The weights the plan is made for (``coec.io.provenance.planned_identity``: a local folder's
        file digests, a hub id's commit; nothing for an embedded model, a workflow output), once per
        model and plan. Part of every model stage's --expect, so changed weights re-plan exactly
        that model's jobs, and a job that finds other weights than planned stops before any work."""
        m = self.model(model)
        if m["source"] == "embedded":
            return {}
        if model not in self._identity:
            try:
                self._identity[model] = planned_identity(m["source"], m.get("revision"))
            except (OSError, ValueError) as exc:  # e.g. a folder without safetensors weights
                raise ConfigError(f"config: models.{model}: {exc}") from None
        return self._identity[model]

    def expect_json(self, model: str, seqlen_key: str | None = None) -> str:
        """A stage's --expect: the model's num_layers, the config key of the stage's sequence
        length and the planned weights (``identity``), checked before any work."""
        out = {"model": f"models.{model}", "num_layers": self.model(model)["num_layers"], **self.identity(model)}
        if seqlen_key:
            out["seqlen_key"] = seqlen_key
        return json.dumps(out, sort_keys=True)

    def expect(self, wc: Any) -> str:
        return self.expect_json(wc.model)

    def model_input(self, wc: Any) -> list[str]:
        """Files a job depends on for its model (only embedded models are workflow outputs)."""
        return [paths.model_dir(wc.model)] if self.model(wc.model)["source"] == "embedded" else []

    def device_map(self, wc: Any) -> str:
        dm = self.model(wc.model).get("device_map")
        return f"--device-map {shlex_quote(dm)}" if dm else ""

    def dataset_spec(self, name: str) -> dict[str, Any]:
        return dataset_spec(self.config, name)

    def dataset_input(self, name: str) -> list[str]:
        """The text files of a dataset the workflow makes or reads (none for a hub dataset)."""
        d = self.config["datasets"][name]
        if d["source"] == "embedded":
            return [f"{paths.text_dir(name)}/calib.txt", f"{paths.text_dir(name)}/eval.txt"]
        if d["source"] == "files":
            return [d["calib"], d["eval"]]
        return []

    def eval_every(self, wc: Any) -> Any:
        """``--eval-every`` of an embedded dataset's text (``datasets.<dataset>.eval_every``)."""
        return self.config["datasets"][wc.dataset]["eval_every"]

    # ------------------------------------------------------------------------- calibration
    def calibration(self, name: str) -> dict[str, Any]:
        """A calibration set (the resized ones of the figures included)."""
        entry: dict[str, Any] = self.config["calibration"][name]
        return entry

    def calibration_dataset(self, name: str) -> dict[str, Any]:
        """The --dataset of a calibration set; a `disjoint_from` set also names the windows to avoid."""
        c = self.calibration(name)
        spec = self.dataset_spec(c["dataset"])
        if c.get("disjoint_from"):
            o = self.calibration(c["disjoint_from"])
            spec["exclude_windows"] = {"nsamples": o["nsamples"], "seqlen": o["seqlen"], "seed": o["seed"]}
        return spec

    def calibration_text(self, wc: Any) -> list[str]:
        return self.dataset_input(self.calibration(wc.calib)["dataset"])

    def calibration_param(self, key: str) -> Callable[[Any], Any]:
        """A param of a calibrate job: ``calibration.<calib>.<key>``."""
        return lambda wc: self.calibration(wc.calib)[key]

    # ------------------------------------------------------------------------- selection, compensation
    def selection_args(self, wc: Any) -> str:
        """`select`'s --method and --options of a selection name (options {} for the paper's),
        and its width's --channel-multiple / --channel-rounding unless the paper's rule
        (``coec.select.widths.width_args``: the params of a paper cell's select job stay as they were)."""
        spec = self.selections[wc.select]
        args = f"--method {shlex_quote(spec.score)} --options {shlex_quote(json.dumps(spec.options(), sort_keys=True))}"
        width = width_args(selection_width(self.config, wc.select))
        return f"{args} {width}" if width else args

    def compensation(self, name: str) -> dict[str, Any]:
        """A ``compensations`` entry."""
        entry: dict[str, Any] = self.config["compensations"][name]
        return entry

    def blocks(self, model: str) -> list[tuple[int, int]]:
        """(first, last) layer ranges of the compensation jobs of a model."""
        n = self.model(model)["num_layers"]
        size = self.config["compute"]["compensate_block"] or n
        return [(a, min(a + size, n) - 1) for a in range(0, n, size)]

    def comp_files(self, wc: Any) -> list[str]:
        """Per-block compensated weights of a cell; none for the prune-only cell."""
        if self.compensation(wc.comp)["method"] == "none":
            return []
        cell = paths.cell_dir(wc.model, wc.calib, wc.select, wc.ratio, wc.comp)
        return [paths.block_file(cell, a, b) for a, b in self.blocks(wc.model)]

    def comp_options(self, comp: str) -> CommonOptions:
        """The top-level options of a compensation (``compensate.options.resolve``), once per plan."""
        if comp not in self._comp_options:
            spec = self.compensation(comp)
            self._comp_options[comp] = resolve(spec["method"], top_level_options(spec))
        return self._comp_options[comp]

    def method_inputs(self, wc: Any) -> dict[str, str]:
        """The extra inputs of a compensate job's method (``Method.inputs``; none for most),
        name -> path: e.g. blend's base cell block of the same layers and held-out Grams. Once per
        job: the rule's input and its --spec read the same."""
        key = (wc.comp, wc.model, wc.calib, wc.select, wc.ratio, wc.first, wc.last)
        if key not in self._method_inputs:
            job = Job(model=wc.model, calib=wc.calib, select=wc.select, ratio=wc.ratio, first=wc.first, last=wc.last)
            self._method_inputs[key] = method_inputs(self.config, wc.comp, job, self.comp_options(wc.comp))
        return dict(self._method_inputs[key])

    def gram_check_input(self, wc: Any) -> list[str]:
        """The compensate job's Gram check: [path] for a method without errors of its own, else [];
        once per compensation, model and calibration: the rule's input and its --gram-check read the same."""
        key = (wc.comp, wc.model, wc.calib)
        if key not in self._gram_check:
            self._gram_check[key] = gram_check_input(self.config, wc.comp, wc.model, wc.calib)
        return list(self._gram_check[key])

    def gram_check_arg(self, wc: Any) -> str:
        """``--gram-check <path>`` of a compensate job that reads one, else nothing."""
        return " ".join(f"--gram-check {shlex_quote(p)}" for p in self.gram_check_input(wc))

    def comp_constraint(self, base: bool) -> str:
        """The ``comp`` wildcard of rule ``compensate_base`` (``base``: the cells whose blocks a
        method of another cell reads, ``targets.base_cells``; each alternative looks behind at
        its cell's folder) or of rule ``compensate`` (every other cell). ``snakemake --until
        <rule>`` releases no job after a job of that rule, so blend's jobs can run under
        ``--until compensate`` only when their base's blocks come from a rule of another name."""
        if self._base_cells is None:
            self._base_cells = base_cells(self.config)
        alt = "|".join(f"(?<={re.escape(d + '/')}){re.escape(c)}(?![^/])" for d, c in self._base_cells)
        if base:
            return f"(?:{alt})" if alt else "(?!)"
        return f"(?!{alt}){NAME}" if alt else NAME

    def compensate_spec(self, wc: Any) -> str:
        """--spec of a compensation job: the config entry, plus its method's input paths."""
        extra = self.method_inputs(wc)
        spec = self.compensation(wc.comp)
        return json.dumps({**spec, "inputs": extra} if extra else spec, sort_keys=True)

    # ------------------------------------------------------------------------- plug-in code
    def plugin_params(self, rule: str, job_plugins: Callable[[str, Any], set[str]] | None = None) -> dict[str, Any]:
        """``plugins``: the sha256 of the code of every plug-in a job of ``rule`` uses
        (``job_plugins``, by default :meth:`job_plugins`), so that editing a plug-in reruns exactly
        its jobs (Snakemake's params trigger) and, through their outputs, what reads them. No param
        without plug-ins; for a job that uses none, ``NO_PLUGINS``, which Snakemake does not record."""
        if not self.config.get("plugins"):
            return {}
        used = job_plugins or self.job_plugins
        return {"plugins": lambda wc: self.plugin_code(used(rule, wc))}

    def plugin_code(self, specs: set[str]) -> Any:
        """JSON ``{plug-in: sha256 of its code}`` (hashed once per plan), or ``NO_PLUGINS``."""
        for spec in specs - set(self._plugin_sha):
            self._plugin_sha[spec] = plugin_sha256(spec)
        return json.dumps({s: self._plugin_sha[s] for s in sorted(specs)}) if specs else NO_PLUGINS

    def job_plugins(self, rule: str, wc: Any) -> set[str]:
        """The plug-ins whose entries a job uses: its model's family; a select job's score, a
        compensate job's method, a zeroshot job's tasks."""
        used: set[str | None] = set(self.family_plugins(wc.model)) if hasattr(wc, "model") else set()
        if rule == "select":
            used.add(SCORES.plugin_of(self.selections[wc.select].score))
        elif rule == "compensate":
            used.add(METHODS.plugin_of(self.compensation(wc.comp)["method"]))
        elif rule == "zeroshot":
            used.update(TASKS.plugin_of(t) for t in self.evaluation.get("zeroshot_tasks", []))
        return {p for p in used if p is not None}

    def family_plugins(self, model: str) -> set[str]:
        """The plug-in of a model's family (``coec.model.arch.ADAPTERS``), read from a local folder's
        config.json; every family plug-in where the family is not known before a job runs (a
        hub id); none for an embedded model (a built-in family)."""
        plugged = ADAPTERS.plugins()
        m = self.model(model)
        if not plugged or m["source"] == "embedded":
            return set()
        family = local_model_type(m["source"])
        if family is None:
            return plugged
        spec = ADAPTERS.plugin_of(family)
        return {spec} if spec else set()

    # ------------------------------------------------------------------------- evaluation
    def ppl_params(self) -> dict[str, Any]:
        ev = self.evaluation
        return dict(
            dataset=json.dumps(self.dataset_spec(ev["ppl_dataset"])),
            seqlen=ev["ppl_seqlen"],
            max_windows=ev.get("ppl_max_windows") or 0,
            batch=ev["ppl_batch_size"],
            device=self.device,
            expect=lambda wc: self.expect_json(wc.model, "evaluation.ppl_seqlen"),
            hub=self.hub,
        )

    def zeroshot_input(self) -> list[str]:
        return [paths.ZEROSHOT_MANIFEST] if self.evaluation["zeroshot_source"] == "local" else []

    def zeroshot_params(self) -> dict[str, Any]:
        ev = self.evaluation
        local = ev["zeroshot_source"] == "local"
        return dict(
            tasks=list(ev.get("zeroshot_tasks", [])),
            data=f"--data-dir {shlex_quote(paths.ZEROSHOT_DATA)}" if local else "",
            limit=ev.get("zeroshot_limit") or 0,
            batch=ev["zeroshot_batch_size"],
            max_length=ev["zeroshot_max_length"],
            device=self.device,
            expect=self.expect,
            hub=self.hub,
            samples="--log-samples" if ev["zeroshot_log_samples"] else "--no-log-samples",
        )

    def zeroshot_outputs(self, folder: str) -> dict[str, Any]:
        """zeroshot.json (the summary the tables read; listed first: the shell's --out) and
        lm-eval's own records next to it: zeroshot_lm_eval.json, zeroshot_samples/<task>.jsonl."""
        out: dict[str, Any] = dict(summary=f"{folder}/zeroshot.json", lm_eval=f"{folder}/zeroshot_lm_eval.json")
        if self.evaluation["zeroshot_log_samples"]:
            out["samples"] = [
                f"{folder}/zeroshot_samples/{t}.jsonl" for t in dict.fromkeys(self.evaluation.get("zeroshot_tasks", []))
            ]
        return out

    @staticmethod
    def cell_args(wc: Any, input: Any) -> str:
        """--keep, --comp and --cell of an evaluation job, each word shell-quoted."""
        comp = [input.comp] if isinstance(input.comp, str) else list(input.comp)
        return "--keep {} --comp {} --cell {}".format(
            shlex_quote(input.keep), " ".join(shlex_quote(c) for c in comp), shlex_quote(json.dumps(dict(wc.items())))
        )

    @staticmethod
    def cell_label_args(wc: Any) -> str:
        """--cell of a job without a keep set (the dense model's export), shell-quoted."""
        return f"--cell {shlex_quote(json.dumps(dict(wc.items())))}"

    # ------------------------------------------------------------------------- GGUF exports
    def imatrix_calibration(self) -> str:
        """The dense model's imatrix calibration set (``imatrix_calibration``, else the first)."""
        name = self.config.get("imatrix_calibration") or next(iter(self.config["calibration"]))
        if name not in self.config["calibration"]:
            raise ConfigError(f"config: imatrix_calibration: unknown calibration set {name!r}")
        return str(name)

    def gguf_imatrix(self, wc: Any) -> list[str]:
        """The importance matrix a GGUF export reads: the cell's own (``imatrix.safetensors``) or
        the dense model's on :meth:`imatrix_calibration`, for a ``<type>-imatrix`` target; none
        otherwise."""
        if not split_gguf_variant(wc.gguf_type)[1]:
            return []
        if "comp" in wc.keys():
            return [paths.imatrix_file(paths.cell_dir(wc.model, wc.calib, wc.select, wc.ratio, wc.comp))]
        return [paths.imatrix_file(paths.dense_dir(wc.model), self.imatrix_calibration())]

    @staticmethod
    def gguf_args(wc: Any, input: Any) -> str:
        """--gguf-type of a GGUF export target's name, and --imatrix when it names one."""
        gguf_type, imatrix = split_gguf_variant(wc.gguf_type)
        args = f"--gguf-type {shlex_quote(gguf_type)}"
        return f"{args} --imatrix {shlex_quote(input.imatrix[0])}" if imatrix else args
