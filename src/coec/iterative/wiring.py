"""What the iterative method's rules wire (``workflow/rules/iterative.smk``), as functions of the
validated config and a job's wildcards, beside :class:`coec.workflow.wiring.Wiring`."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from shlex import quote
from typing import Any

from coec.config.validate import schema_default
from coec.io.paths import RATIO_PATTERN
from coec.iterative import targets
from coec.workflow.wiring import Wiring


def alternatives(names: Iterable[str]) -> str:
    """A regex matching exactly the given names (never matching when there are none)."""
    return "|".join(re.escape(n) for n in names) or "(?!x)x"


class IterativeWiring:
    """The iterative rules' wiring of one validated config."""

    #: the step folder's {method}: {mode}-{structure}
    METHOD = r"(global|sequential)-(uniform|al-am)"
    #: a step folder's chain of cumulative ratios, e.g. 0.1/0.2/0.3
    CHAIN = rf"{RATIO_PATTERN}(/{RATIO_PATTERN})*"

    def __init__(self, wiring: Wiring):
        self.w = wiring
        self.config = wiring.config  # the planned config: the resized mixes included
        self.mixes = targets.mix_entries(self.config)
        self.variants = targets.variant_entries(self.config)
        self.domains = self.config.get("domains", {})
        #: wildcard constraints: the variants; the mixes; the domains whose text a rule writes
        self.variant_constraint = alternatives(self.variants)
        self.mix_constraint = alternatives(self.mixes)
        self.domain_constraint = alternatives([d for d, s in self.domains.items() if s["source"] != "dataset"])

    def text_inputs(self, wc: Any) -> list[str]:
        """The text files of a calibration or mix's domains."""
        if wc.calib not in self.mixes:
            return self.w.dataset_input(targets.calibration_entry(self.config, wc.calib)["dataset"])
        files: list[str] = []
        for d in self.mixes[wc.calib]["domains"]:
            dom = self.domains[d]
            files += (
                self.w.dataset_input(dom["dataset"])
                if dom["source"] == "dataset"
                else [f"{targets.domain_dir(d)}/calib.txt"]
            )
        return files

    def calib_params(self) -> dict[str, Any]:
        """params shared by the rules that run a calibration pass."""
        cfg = self.config

        def c(wc: Any) -> dict[str, Any]:
            return targets.calibration_entry(cfg, wc.calib)

        return dict(
            model=self.w.model_path,
            domains=lambda wc: json.dumps(targets.calibration_domains(cfg, wc.calib), sort_keys=True),
            nsamples=lambda wc: c(wc)["nsamples"],
            seqlen=lambda wc: c(wc)["seqlen"],
            seed=lambda wc: c(wc)["seed"],
            batch=lambda wc: c(wc)["batch_size"],
            gram_dtype=lambda wc: c(wc)["gram_dtype"],
            variance_mix=lambda wc: c(wc).get("variance_mix", schema_default("iterative.mixes.*.variance_mix")),
            dtype=self.w.model_dtype,
            device=self.w.device,
            expect=lambda wc: self.w.expect_json(wc.model, f"{targets.calibration_key(cfg, wc.calib)}.seqlen"),
            hub=self.w.hub,
        )

    def cell_steps(self, wc: Any) -> list[str]:
        """The step folders of an iterative cell's chain, first to last."""
        return targets.cell_steps(self.config, wc.model, wc.calib, wc.variant, wc.ratio)

    def step_infos(self, wc: Any) -> list[str]:
        return [f"{d}/iterative.json" for d in self.cell_steps(wc)]

    def last_step_keep(self, wc: Any) -> str:
        return f"{self.cell_steps(wc)[-1]}/keep.json"

    def last_step_bias(self, wc: Any) -> str:
        return f"{self.cell_steps(wc)[-1]}/bias.safetensors"

    @staticmethod
    def parent(wc: Any) -> str | None:
        """The previous step's folder of a step, or None for a first step."""
        head = wc.chain.rsplit("/", 1)
        if len(head) == 1:
            return None
        return f"{targets.steps_dir(wc.model, wc.calib, wc.method)}/{head[0]}"

    def parent_files(self, wc: Any) -> list[str]:
        """keep.json, bias and state of a step's parent ([] for a first step)."""
        parent = self.parent(wc)
        files = ("keep.json", "bias.safetensors", "state.safetensors")
        return [] if parent is None else [f"{parent}/{f}" for f in files]

    @staticmethod
    def step_ratio(wc: Any) -> str:
        """The cumulative ratio a step prunes to: the last of its chain."""
        return str(wc.chain.rsplit("/", 1)[-1])

    @staticmethod
    def step_mode(wc: Any) -> str:
        """global | sequential: the {mode} of a step's {method}."""
        return str(wc.method.split("-", 1)[0])

    @staticmethod
    def step_structure(wc: Any) -> str:
        """uniform | al-am: the {structure} of a step's {method}."""
        return str(wc.method.split("-", 1)[1])

    def init_arg(self, wc: Any) -> str:
        """``--init <parent step>`` of a step that continues one, else nothing."""
        parent = self.parent(wc)
        return "" if parent is None else f"--init {quote(parent)}"

    def cell_block(self, wc: Any) -> str:
        """The single block file of an iterative cell (all layers)."""
        cell = targets.cell_dir(wc.model, wc.calib, wc.variant, wc.ratio)
        return f"{cell}/block0-{self.w.model(wc.model)['num_layers'] - 1}.safetensors"

    def variant_json(self, wc: Any) -> str:
        return json.dumps(targets.variant_spec(self.config, wc.variant), sort_keys=True)

    @staticmethod
    def step_outdir(wc: Any, output: Any) -> str:
        return os.path.dirname(str(output.keep))
