"""What the width search's rules wire (``workflow/rules/search.smk``; docs/search.md), as
functions of the validated config and a job's wildcards, beside :class:`coec.workflow.wiring.Wiring`.

    results/{model}/{calib}/search/{select}/{comp}/layer{i}.safetensors (+ .json)   rule search_candidates
    results/{model}/{calib}/{search}-{ratio}/keep.json, search.json                 rule search

A layer's candidates are named by the selection and the compensation they take, not by the
search: searches that share them (another budget, ratio or allocation) share the files, and a
new compensation reruns only its own candidates.
"""

from __future__ import annotations

import json
from shlex import quote
from typing import Any

from coec.compensate.inputs import Job, OtherCell
from coec.compensate.methods import METHODS
from coec.compensate.options import method
from coec.io import paths
from coec.select.scores import SCORES
from coec.select.search import OPTION_KEYS, search_entries
from coec.select.widths import selection_width
from coec.workflow.wiring import Wiring


class SearchWiring:
    """The search rules' wiring of one validated config."""

    def __init__(self, wiring: Wiring):
        self.w = wiring
        self.config = wiring.config
        self.searches = search_entries(self.config)
        self._inputs: dict[tuple[str, ...], dict[str, str]] = {}

    def entry(self, wc: Any) -> dict[str, Any]:
        """The search entry of a search job's ``select``."""
        return self.searches[wc.select]

    # ------------------------------------------------------------------------- candidates
    def candidate_args(self, wc: Any) -> str:
        """--method, --options and --channel-multiple of a candidates job: its selection's score,
        options and multiple (its levels)."""
        spec = self.w.selections[wc.select]
        multiple, _ = selection_width(self.config, wc.select)
        options = quote(json.dumps(spec.options(), sort_keys=True))
        return f"--method {quote(spec.score)} --options {options} --channel-multiple {multiple}"

    def candidate_inputs(self, wc: Any) -> dict[str, str]:
        """The extra inputs of a candidates job's compensation method (``Method.inputs``), name ->
        path, as a compensate job's: another calibration's Grams (blend's ``holdout``) as they
        are; another cell's weights (blend's ``base``) as that compensation's candidates of the same
        layer and selection. Once per job: the rule's input and its --spec read the same."""
        key = (wc.comp, wc.model, wc.calib, wc.select, wc.layer)
        if key not in self._inputs:
            m = method(self.w.compensation(wc.comp)["method"])
            options = self.w.comp_options(wc.comp)
            job = Job(model=wc.model, calib=wc.calib, select=wc.select, ratio="0", first=wc.layer, last=wc.layer)
            out = {}
            for inp in m.inputs:
                if isinstance(inp, OtherCell):
                    other = getattr(options, inp.option)
                    out[inp.name] = paths.search_candidates_file(wc.model, wc.calib, wc.select, other, wc.layer)
                elif (path := inp.workflow_path(options, job)) is not None:
                    out[inp.name] = path
            self._inputs[key] = out
        return dict(self._inputs[key])

    def compensation_spec(self, wc: Any) -> str:
        """--spec of a candidates job: the compensations entry, plus its method's input paths."""
        extra = self.candidate_inputs(wc)
        spec = self.w.compensation(wc.comp)
        return json.dumps({**spec, "inputs": extra} if extra else spec, sort_keys=True)

    def candidate_files(self, wc: Any) -> list[str]:
        """The candidates of every layer a search job reads, in layer order."""
        e = self.entry(wc)
        n = self.w.model(wc.model)["num_layers"]
        return [
            paths.search_candidates_file(wc.model, wc.calib, e["candidates"], e["compensation"], i) for i in range(n)
        ]

    # ------------------------------------------------------------------------- the search
    def holdout_text(self, wc: Any) -> list[str]:
        """The text files of the held-out calibration set's dataset."""
        return self.w.dataset_input(self.w.calibration(self.entry(wc)["holdout"])["dataset"])

    def holdout(self, wc: Any) -> str:
        """--holdout: the held-out windows (a calibration set: its dataset spec, with the windows
        it is disjoint from, count, length and seed)."""
        name = self.entry(wc)["holdout"]
        c = self.w.calibration(name)
        spec = {"dataset": self.w.calibration_dataset(name), **{k: c[k] for k in ("nsamples", "seqlen", "seed")}}
        return json.dumps(spec, sort_keys=True)

    def grams_input(self, wc: Any) -> list[str]:
        """The calibration's Grams for AL-AM's scores (none for the evolutionary search)."""
        return [paths.grams_dir(wc.model, wc.calib)] if self.entry(wc)["allocation"] == "alam" else []

    def run_args(self, wc: Any) -> str:
        """Every option of a search job but its files: the name, the width rule of its candidates'
        selection, the budget, the allocation and the search options, each word shell-quoted."""
        e = self.entry(wc)
        multiple, rounding = selection_width(self.config, e["candidates"])
        args = {
            "name": wc.select,
            "channel-multiple": multiple,
            "channel-rounding": rounding,
            "budget": json.dumps(self.job_budget(e["budget"]), sort_keys=True),
            "allocation": e["allocation"],
        }
        for k in OPTION_KEYS:
            v = e[k]
            args[k.replace("_", "-")] = json.dumps(v) if isinstance(v, list) else v
        return " ".join(f"--{k} {quote(str(v))}" for k, v in args.items())

    def job_budget(self, budget: Any) -> Any:
        """The budget as the job reads it: ``{uniform: S}`` becomes the width rule of selection S
        (``{uniform: {channel_multiple: M, channel_rounding: R}}``), the others pass as written."""
        if isinstance(budget, dict) and set(budget) == {"uniform"}:
            multiple, rounding = selection_width(self.config, budget["uniform"])
            return {"uniform": {"channel_multiple": multiple, "channel_rounding": rounding}}
        return budget

    def grams_arg(self, wc: Any, input: Any) -> str:
        return " ".join(f"--grams {quote(str(g))}" for g in input.grams)

    # ------------------------------------------------------------------------- plug-in code
    def plugin_params(self, rule: str) -> dict[str, Any]:
        """``plugins`` of a candidates job (its model's family, its selection's score, its
        compensation's method) or a search job (its model's family), as ``Wiring.plugin_params``."""
        return self.w.plugin_params(rule, self.job_plugins)

    def job_plugins(self, rule: str, wc: Any) -> set[str]:
        used: set[str | None] = set(self.w.family_plugins(wc.model))
        if rule == "search_candidates":
            used.add(SCORES.plugin_of(self.w.selections[wc.select].score))
            used.add(METHODS.plugin_of(self.w.compensation(wc.comp)["method"]))
        return {p for p in used if p is not None}
