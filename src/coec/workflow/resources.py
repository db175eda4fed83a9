"""The resources and threads of the rules' jobs, from the validated config's ``resources``
(``default`` < ``<rule>`` < ``models.<model>.resources.<rule>``) and ``compute`` sections; where
none of them sets a resource, :data:`RESOURCE_DEFAULTS` (the one home of those fallbacks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coec.model.stream_options import OPTIONS, STAGE_OPTIONS

#: a job's resources where the config sets none (mem_mb in MB, runtime in minutes)
RESOURCE_DEFAULTS: dict[str, int] = {"gpu": 0, "mem_mb": 8000, "runtime": 60, "cpus_per_task": 1}
#: torch threads of a job whose config sets neither threads nor CPUs
DEFAULT_THREADS = 2
#: SLURM resources passed only where the config gives them (else the profile's default-resources)
SLURM_STRING_RESOURCES = ("slurm_partition", "slurm_account", "gpu_model", "slurm_extra")

Wildcards = Any
PerJob = Callable[[Wildcards], Any]


class JobResources:
    """Resources and threads of one validated config's jobs (a base of ``coec.workflow.wiring.Wiring``)."""

    config: dict[str, Any]

    def _levels(self, rule_name: str, model: str | None) -> list[dict[str, Any]]:
        res = self.config.get("resources", {})
        levels = [res.get("default", {}), res.get(rule_name, {})]
        if model:
            levels.append(self.config["models"][model].get("resources", {}).get(rule_name, {}))
        return levels

    def resource(self, rule_name: str, key: str, default: Any = None) -> PerJob:
        """A resource of a rule's jobs: config.resources.default < .<rule> < models.<model>.resources.<rule>,
        else ``default`` (the profile's when None); a callable of wildcards."""

        def get(wc: Wildcards) -> Any:
            out: dict[str, Any] = {}
            for level in self._levels(rule_name, getattr(wc, "model", None)):
                out.update(level)
            return out.get(key, default)

        return get

    def configured(self, rule_name: str, key: str) -> bool:
        """Whether config.resources (default or the rule) or any model's resources set ``key``."""
        res = self.config.get("resources", {})
        levels = [res.get("default", {}), res.get(rule_name, {})]
        levels += [(m or {}).get("resources", {}).get(rule_name, {}) for m in self.config.get("models", {}).values()]
        return any(key in lvl for lvl in levels)

    def rule_resources(self, rule_name: str) -> dict[str, Any]:
        """Resources of a rule, per job: gpu, mem_mb, runtime, and the CPUs as ``cpus_per_gpu`` on
        GPU jobs (the config's ``cpus_per_gpu``, else its ``cpus_per_task``; so they scale with a
        model's GPU count) or ``cpus_per_task`` on CPU jobs, the other one 0 (the SLURM executor
        lets a set ``cpus_per_task`` win over ``cpus_per_gpu``). The SLURM string resources are set
        only where the config gives them (profiles/slurm/site.yaml), so the profile's
        ``default-resources`` apply otherwise; gpu_model only on GPU jobs."""
        gpu = self.resource(rule_name, "gpu", RESOURCE_DEFAULTS["gpu"])
        per_task = self.resource(rule_name, "cpus_per_task", RESOURCE_DEFAULTS["cpus_per_task"])
        per_gpu = self.resource(rule_name, "cpus_per_gpu", None)

        def cpus_per_task(wc: Wildcards) -> int:
            return 0 if gpu(wc) > 0 else int(per_task(wc))

        def cpus_per_gpu(wc: Wildcards) -> int:
            return int(per_gpu(wc) or per_task(wc)) if gpu(wc) > 0 else 0

        out: dict[str, Any] = dict(
            gpu=gpu,
            mem_mb=self.resource(rule_name, "mem_mb", RESOURCE_DEFAULTS["mem_mb"]),
            runtime=self.resource(rule_name, "runtime", RESOURCE_DEFAULTS["runtime"]),
            cpus_per_task=cpus_per_task,
            cpus_per_gpu=cpus_per_gpu,
        )
        for key in SLURM_STRING_RESOURCES:
            if self.configured(rule_name, key):
                out[key] = self.resource(rule_name, key, "")
        if "gpu_model" in out:  # a site-wide gpu_model (resources.default) must not reach CPU jobs
            model = out["gpu_model"]
            out["gpu_model"] = lambda wc: model(wc) if gpu(wc) > 0 else ""
        return out

    def stream_resources(self, stage: str) -> dict[str, str]:
        """The streaming options of a calibrate / ppl / zeroshot job (``coec.model.stream_options``)
        from the config's ``compute`` section, as resources named by the option: they change a
        job's memory and time, never its result (the streamed and the loaded model give the same
        files, docs/streaming.md), so a change reruns nothing, as a change of ``mem_mb`` does not.
        The rules pass each as ``--<flag> {resources.<name>:q}``."""
        compute = self.config["compute"]
        return {dest: str(compute[OPTIONS[dest][1].removeprefix("compute.")]) for dest in STAGE_OPTIONS[stage]}

    def export_resources(self) -> dict[str, Any]:
        """``resources.export`` where the config sets it; else the ppl job's memory and runtime
        (an export holds the same model in memory), on CPU."""
        out = self.rule_resources("export")
        for key in ("mem_mb", "runtime"):
            if not self.configured("export", key):
                out[key] = self.resource("ppl", key, RESOURCE_DEFAULTS[key])
        return out

    def threads(self, rule_name: str, keys: tuple[str, ...] = ("threads",)) -> Any:
        """Torch threads of a rule's jobs (``threads:``, passed on as OMP_NUM_THREADS), per job.

        The first of ``config.compute.<keys>`` that is set and not 0 (a laptop config fixes them);
        else the CPUs the job's resources request when the config sets any for the rule:
        ``cpus_per_task`` on a CPU job, ``gpu x cpus_per_gpu`` on a GPU job (the SLURM executor's
        convention: threads = the CPUs the job is given); else :data:`DEFAULT_THREADS`. Snakemake
        caps the value at ``--cores``."""
        compute = self.config["compute"]
        for key in keys:
            if compute.get(key):
                return compute[key]
        if not (self.configured(rule_name, "cpus_per_task") or self.configured(rule_name, "cpus_per_gpu")):
            return DEFAULT_THREADS
        cpus = self.rule_resources(rule_name)

        def threads(wildcards: Wildcards) -> int:
            gpu = cpus["gpu"](wildcards)
            return max(1, int(gpu * cpus["cpus_per_gpu"](wildcards) if gpu > 0 else cpus["cpus_per_task"](wildcards)))

        return threads
