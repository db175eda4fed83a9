# Helpers shared by the rules, and only helpers: config validation, path scheme, per-rule resources.
# Which result files each table and figure reads, and its spec: coec.targets (pure functions).
import json
import re
import sys
from shlex import quote as shlex_quote

from coec import targets
from coec.config import SCHEMA, ConfigError, validate_config
from coec.provenance import planned_identity

validate_config(config, SCHEMA)  # the schema is package data of coec (src/coec/schemas/)


# Fig. 2 calibration sets: the base set with nsamples replaced
targets.add_fig2_calibrations(config)


def coec_command(deployment_methods, executable=sys.executable):
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


PY = coec_command(workflow.deployment_settings.deployment_method)
# envs/coec.post-deploy.sh installs this repository into a fresh --sdm conda environment
os.environ.update(COEC_SOURCE=workflow.basedir)  # set for the post-deploy script, not read here


# selection name -> coec.select.ScoreSpec: the paper's wanda_sp | flap | rcpu plus config `selections`
from coec.select import selection_registry

SELECTION_SPECS = selection_registry(config.get("selections"))


def selection_args(name):
    """`select`'s --method and --options of a selection name (options {} for the paper's)."""
    spec = SELECTION_SPECS[name]
    return f"--method {shlex_quote(spec.score)} --options {shlex_quote(json.dumps(spec.options(), sort_keys=True))}"


wildcard_constraints:
    model=r"[^/]+",
    calib=r"[^/]+",
    select="|".join(re.escape(n) for n in sorted(SELECTION_SPECS, key=len, reverse=True)),
    ratio=r"0\.[0-9]+",
    comp=r"[^/]+",
    first=r"[0-9]+",
    last=r"[0-9]+",


fmt_ratio = targets.fmt_ratio
cell_dir = targets.cell_dir


def model_cfg(name):
    return config["models"][name]


def model_path(name):
    """What the CLI loads: the converted folder for embedded models, else the hub id / dir."""
    return targets.model_path(config, name)


def hub_args(model):
    """--revision / --trust-remote-code of a model's config (models.<m>.revision,
    .trust_remote_code), each word shell-quoted; empty when neither is set."""
    m = model_cfg(model)
    args = ["--revision", shlex_quote(str(m["revision"]))] if m.get("revision") else []
    return " ".join(args + (["--trust-remote-code"] if m.get("trust_remote_code") else []))


MODEL_IDENTITY = {}  # model -> its planned_identity, once per plan


def model_identity(model):
    """The weights the plan is made for (``coec.provenance.planned_identity``: a local folder's
    file digests, a hub id's commit; nothing for an embedded model, a workflow output), once per
    model and plan. Part of every model stage's --expect, so it is one of the jobs' params (changed
    weights re-plan exactly that model's jobs, and a job that finds other weights than planned
    stops before any work)."""
    m = model_cfg(model)
    if m["source"] == "embedded":
        return {}
    if model not in MODEL_IDENTITY:
        try:
            MODEL_IDENTITY[model] = planned_identity(m["source"], m.get("revision"))
        except (OSError, ValueError) as exc:  # e.g. a folder without safetensors weights
            raise ConfigError(f"config: models.{model}: {exc}") from None
    return MODEL_IDENTITY[model]


def model_expect(model, seqlen_key=None):
    """A stage's --expect: what the config says of the model (its num_layers; the config key of
    the stage's sequence length) and the weights planned for (``model_identity``), checked
    against the model before any work."""
    out = {"model": f"models.{model}", "num_layers": model_cfg(model)["num_layers"],
           **model_identity(model)}
    if seqlen_key:
        out["seqlen_key"] = seqlen_key
    return json.dumps(out, sort_keys=True)


def model_input(wc):
    """Files a job depends on for its model (only embedded models are workflow outputs)."""
    m = model_cfg(wc.model)
    return [f"resources/models/{wc.model}"] if m["source"] == "embedded" else []


def dataset_spec(name):
    return targets.dataset_spec(config, name)


def dataset_input(name):
    d = config["datasets"][name]
    if d["source"] == "embedded":
        return [f"resources/text/{name}/calib.txt", f"resources/text/{name}/eval.txt"]
    if d["source"] == "files":
        return [d["calib"], d["eval"]]
    return []


def comp_spec(name):
    return config["compensations"][name]


def blocks(model):
    """(first, last) layer ranges of the compensation jobs of a model."""
    n = model_cfg(model)["num_layers"]
    size = config["compute"]["compensate_block"] or n
    return [(a, min(a + size, n) - 1) for a in range(0, n, size)]


def comp_files(wc):
    """Per-block compensated weights of a cell; none for the prune-only cell."""
    if comp_spec(wc.comp)["method"] == "none":
        return []
    base = cell_dir(wc.model, wc.calib, wc.select, wc.ratio, wc.comp)
    return [f"{base}/block{a}-{b}.safetensors" for a, b in blocks(wc.model)]


def blend_inputs(wc):
    """A blend cell's extra inputs (none for the other methods): the base cell's block of the
    same layers and, with `holdout`, the held-out calibration set's Grams."""
    spec = comp_spec(wc.comp)
    if spec["method"] != "blend":
        return {}
    base = cell_dir(wc.model, wc.calib, wc.select, wc.ratio, spec.get("base", "coec"))
    out = {"base": os.path.join(base, f"block{wc.first}-{wc.last}.safetensors")}
    if spec.get("holdout"):
        out["holdout"] = f"results/{wc.model}/grams/{spec['holdout']}"
    return out


def compensate_spec(wc):
    """--spec of a compensation job: the config entry, plus a blend's input paths."""
    extra = blend_inputs(wc)
    return json.dumps({**comp_spec(wc.comp), "inputs": extra} if extra else comp_spec(wc.comp),
                      sort_keys=True)


def res(rule_name, key, default=None):
    """A resource for a rule, from config.resources.default < config.resources.<rule> <
    models.<model>.resources.<rule>; returns a callable of wildcards."""

    def get(wc):
        out = dict(config.get("resources", {}).get("default", {}))
        out.update(config.get("resources", {}).get(rule_name, {}))
        model = getattr(wc, "model", None)
        if model:
            out.update(model_cfg(model).get("resources", {}).get(rule_name, {}))
        return out.get(key, default)

    return get


SLURM_STRING_RESOURCES = ("slurm_partition", "slurm_account", "gpu_model", "slurm_extra")


def _configured(rule_name, key):
    """Whether config.resources (default or the rule) or any model's resources set ``key``."""
    levels = [config.get("resources", {}).get("default", {}), config.get("resources", {}).get(rule_name, {})]
    levels += [(m or {}).get("resources", {}).get(rule_name, {}) for m in config.get("models", {}).values()]
    return any(key in lvl for lvl in levels)


def rule_resources(rule_name):
    """Resources of a rule, per job from the config (``res``): gpu, mem_mb, runtime, and the CPUs
    as ``cpus_per_gpu`` on GPU jobs (the config's ``cpus_per_gpu``, else its ``cpus_per_task``;
    so they scale with a model's GPU count) or ``cpus_per_task`` on CPU jobs, the other one 0
    (the SLURM executor lets a set ``cpus_per_task`` win over ``cpus_per_gpu``). The SLURM string
    resources (partition, account, gpu_model, slurm_extra) are set only where the config gives them
    (profiles/slurm/site.yaml), so the profile's ``default-resources`` apply otherwise; gpu_model
    only on GPU jobs."""
    gpu = res(rule_name, "gpu", 0)
    per_task = res(rule_name, "cpus_per_task", 1)
    per_gpu = res(rule_name, "cpus_per_gpu", None)

    def cpus_per_task(wc):
        return 0 if gpu(wc) > 0 else per_task(wc)

    def cpus_per_gpu(wc):
        return (per_gpu(wc) or per_task(wc)) if gpu(wc) > 0 else 0

    out = dict(gpu=gpu, mem_mb=res(rule_name, "mem_mb", 8000), runtime=res(rule_name, "runtime", 60),
               cpus_per_task=cpus_per_task, cpus_per_gpu=cpus_per_gpu)
    for key in SLURM_STRING_RESOURCES:
        if _configured(rule_name, key):
            out[key] = res(rule_name, key, "")
    if "gpu_model" in out:  # a site-wide gpu_model (resources.default) must not reach CPU jobs
        model = out["gpu_model"]
        out["gpu_model"] = lambda wc: model(wc) if gpu(wc) > 0 else ""
    return out


def job_threads(rule_name, keys=("threads",)):
    """Torch threads of a rule's jobs (``threads:``, passed on as OMP_NUM_THREADS), per job.

    The first of ``config.compute.<keys>`` that is set and not 0 (a laptop config fixes them);
    else the CPUs the job's resources request when the config sets any for the rule:
    ``cpus_per_task`` on a CPU job, ``gpu x cpus_per_gpu`` on a GPU job (the SLURM executor's
    convention: threads = the CPUs the job is given); else 2. 0 exists because a config given by
    ``--configfile`` is merged over config.yaml and cannot unset its keys. Snakemake caps the
    value at ``--cores``."""
    compute = config.get("compute", {})
    for key in keys:
        if compute.get(key):
            return compute[key]
    if not (_configured(rule_name, "cpus_per_task") or _configured(rule_name, "cpus_per_gpu")):
        return 2
    cpus = rule_resources(rule_name)

    def threads(wildcards):
        gpu = cpus["gpu"](wildcards)
        return max(1, gpu * cpus["cpus_per_gpu"](wildcards) if gpu > 0 else cpus["cpus_per_task"](wildcards))

    return threads


def export_resources():
    """``resources.export`` where the config sets it; else the ppl job's memory and runtime
    (an export holds the same model in memory), on CPU."""
    out = rule_resources("export")
    for key, default in (("mem_mb", 8000), ("runtime", 60)):
        if not _configured("export", key):
            out[key] = res("ppl", key, default)
    return out


# ----------------------------------------------------------------------------- calibration
def calib_cfg(name):
    return config["calibration"][name]


def calib_dataset_spec(name):
    """The --dataset of a calibration set; a `disjoint_from` set also names the windows to avoid."""
    c = calib_cfg(name)
    spec = dataset_spec(c["dataset"])
    if c.get("disjoint_from"):
        o = calib_cfg(c["disjoint_from"])
        spec["exclude_windows"] = {"nsamples": o["nsamples"], "seqlen": o["seqlen"], "seed": o["seed"]}
    return spec


# ----------------------------------------------------------------------------- evaluation
EV = config["evaluation"]
ZS_DATA = "resources/zeroshot"
ZS_LOG_SAMPLES = EV["zeroshot_log_samples"]
ZS_INPUT = [f"{ZS_DATA}/manifest.json"] if EV["zeroshot_source"] == "local" else []


# ----------------------------------------------------------------------------- streaming
def stream_args(stage):
    """The streaming options of a calibrate / ppl / zeroshot job (coec.streaming.options), from
    the config's compute section (docs/streaming.md)."""
    from coec.streaming.options import OPTIONS, STAGE_OPTIONS

    flags = [OPTIONS[dest] for dest in STAGE_OPTIONS[stage]]
    return " ".join(f"{flag} {shlex_quote(str(config['compute'][key.split('.')[1]]))}" for flag, key in flags)


def ppl_params():
    return dict(
        dataset=json.dumps(dataset_spec(EV["ppl_dataset"])),
        seqlen=EV["ppl_seqlen"],
        max_windows=EV.get("ppl_max_windows") or 0,
        batch=EV["ppl_batch_size"],
        device=config["compute"]["device"],
        expect=lambda wc: model_expect(wc.model, "evaluation.ppl_seqlen"),
        hub=lambda wc: hub_args(wc.model),
        stream=stream_args("ppl"),
    )


def zeroshot_params():
    local = EV["zeroshot_source"] == "local"
    return dict(
        tasks=list(EV.get("zeroshot_tasks", [])),
        data=f"--data-dir {shlex_quote(ZS_DATA)}" if local else "",
        limit=EV.get("zeroshot_limit") or 0,
        batch=EV["zeroshot_batch_size"],
        max_length=EV["zeroshot_max_length"],
        device=config["compute"]["device"],
        expect=lambda wc: model_expect(wc.model),
        hub=lambda wc: hub_args(wc.model),
        samples="--log-samples" if ZS_LOG_SAMPLES else "--no-log-samples",
        stream=stream_args("zeroshot"),
    )


def cell_args(wc, input):
    """--keep, --comp and --cell of an evaluation job, each word shell-quoted."""
    comp = [input.comp] if isinstance(input.comp, str) else list(input.comp)
    return "--keep {} --comp {} --cell {}".format(
        shlex_quote(input.keep), " ".join(shlex_quote(c) for c in comp),
        shlex_quote(json.dumps(dict(wc.items()))))


def device_map_arg(wc):
    dm = model_cfg(wc.model).get("device_map")
    return f"--device-map {shlex_quote(dm)}" if dm else ""


def zs_outputs(cell_dir):
    """zeroshot.json (the summary the tables read; listed first: the shell's --out) and lm-eval's
    own records next to it: zeroshot_lm_eval.json, zeroshot_samples/<task>.jsonl (docs/zeroshot.md)."""
    out = dict(summary=f"{cell_dir}/zeroshot.json", lm_eval=f"{cell_dir}/zeroshot_lm_eval.json")
    if ZS_LOG_SAMPLES:
        out["samples"] = [f"{cell_dir}/zeroshot_samples/{t}.jsonl"
                          for t in dict.fromkeys(EV.get("zeroshot_tasks", []))]
    return out


# ----------------------------------------------------------------------------- iterative
# (specs and config checks: coec.targets.iterative_*; here the wildcard-side path helpers)
IT = targets.iterative(config)
IT_MIXES = targets.iterative_mixes(config)
IT_VARIANTS = targets.iterative_variants(config)
IT_DOMAINS = config.get("domains", {})


def it_alternatives(names):
    """A regex matching exactly the given names (never matching when there are none)."""
    return "|".join(re.escape(n) for n in names) or "(?!x)x"


def it_text_inputs(wc):
    """The text files of a calibration or mix's domains."""
    if wc.calib not in IT_MIXES:
        return dataset_input(targets.iterative_calibration(config, wc.calib)["dataset"])
    files = []
    for d in IT_MIXES[wc.calib]["domains"]:
        dom = IT_DOMAINS[d]
        files += (dataset_input(dom["dataset"]) if dom["source"] == "dataset"
                  else [f"resources/domains/{d}/calib.txt"])
    return files


def it_calib_params():
    """params shared by the rules that run a calibration pass."""
    c = lambda wc: targets.iterative_calibration(config, wc.calib)
    return dict(
        model=lambda wc: model_path(wc.model),
        domains=lambda wc: json.dumps(targets.iterative_domains(config, wc.calib), sort_keys=True),
        nsamples=lambda wc: c(wc)["nsamples"],
        seqlen=lambda wc: c(wc)["seqlen"],
        seed=lambda wc: c(wc)["seed"],
        batch=lambda wc: c(wc)["batch_size"],
        gram_dtype=lambda wc: c(wc)["gram_dtype"],
        variance_mix=lambda wc: c(wc).get("variance_mix", "pooled"),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        device=config["compute"]["device"],
        expect=lambda wc: model_expect(
            wc.model, f"{targets.iterative_calibration_key(config, wc.calib)}.seqlen"),
        hub=lambda wc: hub_args(wc.model),
    )


def it_cell_steps(wc):
    """The step folders of an iterative cell's chain, first to last."""
    return targets.iterative_cell_steps(config, wc.model, wc.calib, wc.variant, wc.ratio)


def it_parent(wc):
    """The previous step's folder of a step, or None for a first step."""
    head = wc.chain.rsplit("/", 1)
    if len(head) == 1:
        return None
    return f"{targets.iterative_steps_dir(wc.model, wc.calib, wc.method)}/{head[0]}"


def it_parent_files(wc):
    """keep.json, bias and state of a step's parent ([] for a first step)."""
    parent = it_parent(wc)
    files = ("keep.json", "bias.safetensors", "state.safetensors")
    return [] if parent is None else [f"{parent}/{f}" for f in files]


def it_cell_block(wc):
    """The single block file of an iterative cell (all layers)."""
    cell = targets.iterative_cell_dir(wc.model, wc.calib, wc.variant, wc.ratio)
    return f"{cell}/block0-{model_cfg(wc.model)['num_layers'] - 1}.safetensors"
