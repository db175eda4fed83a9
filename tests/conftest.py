"""Shared fixtures: tiny random Llama / Qwen2 / Qwen3 / Mistral / Granite models with a tiny offline tokenizer
(``coec.model.tiny``), saved to temp folders exactly as a hub checkpoint would be."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.model.source import CellSource
from coec.model.tiny import CORPUS, make_model_dir, make_tokenizer, tiny_config
from coec.select.options import SelectOptions

__all__ = ["CORPUS", "make_model_dir", "make_tokenizer", "tiny_config"]  # tests import them from here


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests on one torch thread (small matrices; stable timings)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3", "mistral", "granite"])
def tiny_dir(request, tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="session")
def text_dataset(tmp_path_factory) -> dict:
    """A local ``files`` dataset spec with calibration and evaluation text."""
    d = tmp_path_factory.mktemp("text")
    (d / "calib.txt").write_text(CORPUS)
    (d / "eval.txt").write_text(CORPUS[::-1][:3000] + CORPUS[:3000])
    return {"source": "files", "calib": str(d / "calib.txt"), "eval": str(d / "eval.txt")}


TEST_CONFIG = Path(__file__).resolve().parents[1] / ".test" / "config" / "config.yaml"


def in_work_folder(cfg: dict, work: Path) -> dict:
    """``cfg`` with its local model folders and text files (paths relative to the work folder)
    made absolute under ``work``."""
    cfg = copy.deepcopy(cfg)
    for m in cfg["models"].values():
        if m["source"] != "embedded":
            m["source"] = str(work / m["source"])
    for d in cfg["datasets"].values():
        if d["source"] == "files":
            d.update(calib=str(work / d["calib"]), eval=str(work / d["eval"]))
    return cfg


def write_trimmed_workflow(work: Path) -> tuple[dict, Path]:
    """The trimmed workflow config of .test/config/config.yaml (calibrate -> select ->
    compensate -> ppl -> table1, GPU resources on calibrate and the per-layer compensate jobs)
    with what it reads created under ``work``: a tiny Llama and local text. Returns (config, path
    of its YAML, every path absolute)."""
    import yaml

    make_model_dir(work / "tiny-llama", "llama")
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    cfg = in_work_folder(yaml.safe_load(TEST_CONFIG.read_text()), work)
    cfg_path = work / "trim.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    return cfg, cfg_path


def trimmed_workflow_cmd(work: Path, cfg_path: Path, *extra: str) -> list[str]:
    """The trimmed workflow's Table 1 in ``work`` (2 cores), finishing what a killed run left incomplete."""
    cmd = ["--cores", "2", "--rerun-incomplete", *extra, "results/table1.csv", "--configfile", str(cfg_path)]
    return snakemake_cmd(work, *cmd)


def run_trimmed_workflow(work: Path, cfg_path: Path) -> subprocess.CompletedProcess:
    """:func:`trimmed_workflow_cmd` run to the end; a non-zero exit fails the test."""
    res = subprocess.run(trimmed_workflow_cmd(work, cfg_path), capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root/results`` except logs and per-job timings, with the
    work folder's own path (recorded as the model and text source) replaced by a placeholder,
    so runs in two folders compare."""
    out = {}
    for p in sorted((root / "results").rglob("*")):
        rel = p.relative_to(root / "results").as_posix()
        if p.is_file() and not rel.startswith(("logs/", "benchmarks/")):
            data = p.read_bytes()
            if p.suffix == ".safetensors":  # header length prefix + JSON header + tensor bytes
                n = int.from_bytes(data[:8], "little")
                data = data[8 : 8 + n] + b"|" + data[8 + n :]
            out[rel] = hashlib.sha256(data.replace(str(root).encode(), b"<WORK>")).hexdigest()
    return out


@pytest.fixture(scope="session")
def trimmed_reference(tmp_path_factory) -> tuple[Path, float, dict[str, str]]:
    """One uninterrupted run of the trimmed workflow's Table 1 (:func:`write_trimmed_workflow`,
    :func:`run_trimmed_workflow`) for the whole pytest run: (work folder, wall seconds,
    :func:`file_digests`). Under pytest-xdist the first worker that asks makes it in the folder the
    workers share and the others wait for it (an flock), so the fault-injection and SLURM tests
    compare against one run instead of making one each."""
    import fcntl

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this pytest run's folder, above every worker's own
    work, record = root / "trimmed-reference", root / "trimmed-reference.json"
    with open(root / "trimmed-reference.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not record.is_file():
            shutil.rmtree(work, ignore_errors=True)  # what a worker that failed here left
            _, cfg_path = write_trimmed_workflow(work)
            t0 = time.monotonic()
            run_trimmed_workflow(work, cfg_path)
            seconds = time.monotonic() - t0
            record.write_text(json.dumps({"seconds": seconds, "digests": file_digests(work)}))
    done = json.loads(record.read_text())
    return work, done["seconds"], done["digests"]


# ----------------------------------------------------------------------------- the shared workflow run
#: tests/plugins/: the plug-ins the tests load
PLUGINS = Path(__file__).resolve().parent / "plugins"
#: the shared run's plug-in method (tests/plugins/global_scale.py), copied into its work folder
SHARED_PLUGIN = "global_scale.py"
#: the shared run's aligned-width selection: RCPU's scores, kept channels a multiple of 16 (floor)
ALIGNED = {"score": "rcpu", "channel_multiple": 16, "channel_rounding": "floor"}
#: what the shared run reads, in its work folder (its config names them relative to it)
SHARED_INPUTS = ("tiny-llama", "calib.txt", "eval.txt", SHARED_PLUGIN)


def shared_config() -> dict:
    """The config of the session's one shared run: .test/config/config.yaml (calibrate -> select ->
    compensate -> ppl -> table1 on a tiny Llama, GPU resources on calibrate and compensate) plus a
    blend cell (base coec, held-out set c8h disjoint from c8), an aligned-width selection (rcpu-a16)
    and a plug-in method's row (global_scale, named in ``plugins`` only). Paths are relative to the
    work folder, so a copy of a finished run's folder is the same finished run."""
    import yaml

    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    cfg["plugins"] = [SHARED_PLUGIN]
    cfg["calibration"]["c8h"] = dict(cfg["calibration"]["c8"], seed=1, disjoint_from="c8")
    cfg["selections"] = {"rcpu-a16": dict(ALIGNED)}
    cfg["compensations"]["blend"] = {"method": "blend", "base": "coec", "holdout": "c8h"}
    cfg["compensations"]["scaled"] = {"method": "global_scale"}
    cfg["table1"]["rows"] += [
        {"selection": "wanda_sp", "compensation": "blend"},
        {"selection": "rcpu-a16", "compensation": "rcpu"},
        {"selection": "wanda_sp", "compensation": "scaled"},
    ]
    return cfg


class WorkflowRun:
    """A finished Snakemake run of :func:`shared_config` in a work folder: its inputs, results,
    .snakemake records and config file (``trim.yaml``, paths relative to the folder)."""

    def __init__(self, work: Path, cfg: dict):
        self.work, self.cfg, self.cfg_path = work, cfg, work / "trim.yaml"

    def copy(self, dst: Path) -> WorkflowRun:
        """The same finished run in ``dst`` (every file with its mtime): a test that edits and
        reruns works there, never in the session's run."""
        shutil.copytree(self.work, dst, symlinks=True)
        return WorkflowRun(dst, copy.deepcopy(self.cfg))

    def fresh(self, dst: Path) -> Path:
        """A folder with the run's inputs (links) and config and no results: a plan from nothing."""
        dst.mkdir(parents=True)
        for name in (*SHARED_INPUTS, self.cfg_path.name):
            (dst / name).symlink_to(self.work / name, target_is_directory=(self.work / name).is_dir())
        return dst

    def write_config(self, path: Path, cfg: dict) -> Path:
        """``cfg`` written to ``path`` (anywhere: its paths stay relative to the work folder)."""
        import yaml

        path.write_text(yaml.safe_dump(cfg))
        return path


def run_env() -> dict:
    """The environment of a workflow run: no plug-ins from the environment (a config names its own)."""
    from coec.registry import PLUGINS_ENV

    return {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory) -> WorkflowRun:
    """The session's one real run of the trimmed workflow (:func:`shared_config`, every table1 row,
    through the local profile, which runs the DAG the SLURM profile submits: one job per (cell,
    layer)). Tests read it, plan against it, or copy it (``WorkflowRun.copy``) to edit and rerun."""
    work = tmp_path_factory.mktemp("shared-run")
    make_model_dir(work / "tiny-llama", "llama")
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    shutil.copyfile(PLUGINS / SHARED_PLUGIN, work / SHARED_PLUGIN)
    cfg = shared_config()
    run = WorkflowRun(work, cfg)
    run.write_config(run.cfg_path, cfg)
    profile = str(REPO / "workflow/profiles/default")
    target = ("results/table1.csv", "--configfile", str(run.cfg_path))
    snakemake(work, "--workflow-profile", profile, "--cores", "2", *target, env=run_env())
    return run


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> tuple[Path, Path]:
    """(model folder, text folder) of the embedded SmolLM2-135M (tests/embedded_cells.py), made once
    per worker; skipped with the reason where llama-cpp-python is missing."""
    from coec.evaluate.llamacpp.run import unavailable
    from embedded_cells import prepare

    why = unavailable()
    if why:
        pytest.skip(why)
    return prepare(tmp_path_factory.mktemp("embedded"))


@pytest.fixture(scope="session")
def embedded_cell(embedded, tmp_path_factory):
    """``cell(name) -> (keep.json, block files)`` of the embedded model's ``"table1"`` (rcpu-0.3/coec)
    or ``"al-am"`` (iterative iflap-alam-0.3) cell (tests/embedded_cells.py), each built on first use."""
    import embedded_cells

    build = {"table1": embedded_cells.table1_cell, "al-am": embedded_cells.al_am_cell}
    config = embedded_cells.repo_config()

    @functools.cache
    def cell(name: str) -> tuple[Path, list[Path]]:
        return build[name](config, *embedded, tmp_path_factory.mktemp(name))

    return cell


def full_workflow_config(work: Path) -> dict:
    """A trimmed config that reaches every stage of the paper's grid and of the iterative method
    (every selection and compensation method, Fig. 2, multi-domain mixes, every iterative mode and
    structure) with what it reads created under ``work`` (a tiny Llama, local text): the config of
    ``benchmarks/golden.py``'s digests, every path absolute."""
    model = make_model_dir(work / "tiny-llama", "llama")
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    (work / "code.txt").write_text("def f(x):\n    return [i * x for i in range(10)]\n\n" * 80)
    rows = [
        {"selection": s, "compensation": c}
        for s in ("wanda_sp", "flap", "rcpu")
        for c in ("none", "bias", "lstsq", "rcpu", "coec")
    ]
    return {
        "models": {"tiny": {"source": str(model), "num_layers": 2, "dtype": "float32"}},
        "datasets": {
            "local": {"source": "files", "calib": str(work / "calib.txt"), "eval": str(work / "eval.txt")},
            "code": {"source": "files", "calib": str(work / "code.txt"), "eval": str(work / "code.txt")},
        },
        "calibration": {"c8": {"dataset": "local", "nsamples": 8, "seqlen": 32, "seed": 0, "batch_size": 4}},
        "evaluation": {"ppl_dataset": "local", "ppl_seqlen": 32, "ppl_max_windows": 6, "ppl_batch_size": 2},
        "compensations": {
            "none": {"method": "none"},
            "bias": {"method": "bias"},
            "lstsq": {"method": "lstsq", "ridge": 0.01},
            "rcpu": {"method": "rcpu"},
            "coec": {
                "method": "coec",
                "alpha": 0.9,
                "max_rounds": 3,
                "o_proj": {"align_lambda": 50.0, "anchor_rank": 4},
            },
            "coec-gcv": {"method": "coec", "alpha": 1.0, "rescale": "gcv", "right": "none", "max_rounds": 3},
        },
        "compute": {"device": "cpu", "compensate_block": 1},
        "table1": {"calibration": "c8", "models": ["tiny"], "ratios": [0.5], "rows": rows},
        "table3": {
            "calibration": "c8",
            "models": ["tiny"],
            "ratios": [0.5],
            "rows": [
                {"selection": "rcpu", "compensation": "rcpu", "label": "RCPU"},
                {"selection": "rcpu", "compensation": "coec-gcv", "label": "+ GCV"},
            ],
        },
        "fig2": {
            "model": "tiny",
            "calibration": "c8",
            "nsamples": [4, 8],
            "ratios": [0.5],
            "selection": "rcpu",
            "compensations": ["none", "coec"],
        },
        "domains": {"nl": {"source": "dataset", "dataset": "local"}, "code": {"source": "dataset", "dataset": "code"}},
        "iterative": {
            "mixes": {
                "mix8": {"domains": {"nl": 1, "code": 1}, "nsamples": 8, "seqlen": 32, "batch_size": 4},
                "mix8-eq8": {
                    "domains": {"nl": 2, "code": 1},
                    "nsamples": 8,
                    "seqlen": 32,
                    "batch_size": 4,
                    "variance_mix": "eq8",
                },
            },
            "variants": {
                "flap": {"steps": 1},
                "iflap": {"step": 0.25},
                "seq": {"steps": 2, "mode": "sequential"},
                "alam": {"steps": 2, "structure": "al-am"},
            },
            "table": {
                "calibration": "c8",
                "models": ["tiny"],
                "ratios": [0.5],
                "rows": [
                    {"label": "FLAP", "selection": "flap", "compensation": "bias"},
                    {"label": "iterative", "variant": "iflap"},
                    {"label": "sequential", "variant": "seq"},
                    {"label": "al-am", "variant": "alam"},
                    {"label": "multi-domain", "variant": "flap", "calibration": "mix8"},
                    {"label": "eq8", "variant": "iflap", "calibration": "mix8-eq8"},
                ],
            },
            "calibration_size": {
                "model": "tiny",
                "calibration": "c8",
                "nsamples": [4, 8],
                "ratios": [0.5],
                "rows": [
                    {"label": "FLAP", "selection": "flap", "compensation": "bias"},
                    {"label": "iterative", "variant": "iflap"},
                ],
            },
        },
    }


def job_counts(output: str) -> dict[str, int]:
    """Parse Snakemake's 'Job stats' table."""
    block = output.split("Job stats:")[1]
    counts = {}
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def method_kwargs(method: str, W0, G, mean, keep, n_tokens=1) -> dict:
    """Keywords a generic test passes so that every method runs: the Gram's token count of the
    methods that return a bias, and blend's inputs (a base weight W0[:, keep] and the same
    statistics as its held-out set)."""
    import torch

    if method == "coec":
        return {"max_rounds": 3}
    if method == "bias":
        return {"n_tokens": n_tokens}
    if method != "blend":
        return {}
    k = torch.as_tensor(keep).long()
    return {
        "n_tokens": n_tokens,
        "inputs": {"base_weight": W0[:, k].float(), "holdout_gram": G, "holdout_mean": mean, "holdout_count": n_tokens},
    }


# ----------------------------------------------------------------------------- markers by folder
#: tests/<folder>/ -> the marker every test in it carries: unit (math, parsers and specs; no model),
#: integration (tiny random models through the package API and CLI), workflow (Snakemake runs:
#: dry, trimmed, SLURM, faults). Slow tests (a real embedded model, several whole runs) live in
#: files of their own, ``*_slow.py`` or whole suites, marked ``slow`` for the file.
FOLDER_MARKERS = ("unit", "integration", "workflow")


def pytest_itemcollected(item):
    folder = Path(str(item.fspath)).parent.name
    if folder in FOLDER_MARKERS:
        item.add_marker(folder)


#: the session fixtures that take minutes to make: the test files that name one run on one
#: pytest-xdist worker, which makes it once, and start first
SHARED_FIXTURES = ("shared_run", "embedded_cell")


@functools.cache
def _shared_fixture(path: str) -> str | None:
    """The first of :data:`SHARED_FIXTURES` that the test file at ``path`` (relative to the
    repository) names, or None."""
    text = (REPO / path).read_text()
    return next((name for name in SHARED_FIXTURES if name in text), None)


def pytest_collection_modifyitems(items):
    """The files that read a shared fixture first: under pytest-xdist their worker starts on the
    longest group at once."""
    items.sort(key=lambda item: _shared_fixture(item.nodeid.split("::", 1)[0]) is None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (pyproject.toml's addopts) refined: a file's tests on one worker (its
    module fixtures made once), and the files that read one of :data:`SHARED_FIXTURES` on one worker
    (the fixture made once). pytest 9.2 keeps ``xdist_group`` marks out of the node ids that
    ``--dist loadgroup`` groups by, so the grouping is the scheduler's."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrSharedRun(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _shared_fixture(path) or path

    return FileOrSharedRun(config, log)


# ----------------------------------------------------------------------------- shared helpers
REPO = Path(__file__).resolve().parents[1]
REV = "0123456789abcdef0123456789abcdef01234567"


def snakemake_cmd(workdir: Path | None, *args: str) -> list[str]:
    """``python -m snakemake`` on the repository's Snakefile in ``workdir``; ``workdir`` None: a
    plain ``snakemake`` (no --snakefile, no --directory: the caller's folder decides)."""
    where = [] if workdir is None else ["--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    return [sys.executable, "-m", "snakemake", *where, *args]


def snakemake(
    workdir: Path | None,
    *args: str,
    check: bool = True,
    env: dict | None = None,
    cwd: Path | None = None,
    timeout: int = 900,
) -> subprocess.CompletedProcess:
    """Run :func:`snakemake_cmd` (the one way tests run Snakemake); ``check``: a non-zero exit
    fails the test with the ends of stdout and stderr."""
    res = subprocess.run(
        snakemake_cmd(workdir, *args), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )
    if check and res.returncode:
        raise AssertionError(f"snakemake failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
    return res


def fake_hub_snapshot(src: Path, root: Path, commit: str = REV) -> Path:
    """``src`` laid out like the HF cache: snapshots/<commit>/<file> -> ../../blobs/<sha256>."""
    repo = root / "models--org--tiny"
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        sha = hashlib.sha256(f.read_bytes()).hexdigest()
        blob = repo / "blobs" / sha
        shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    return snap


_RULES_SCRIPT = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings
snakefile, workdir, *configfiles = sys.argv[1:]
with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
    wf = api.workflow(resource_settings=ResourceSettings(), snakefile=Path(snakefile), workdir=Path(workdir),
                      config_settings=ConfigSettings(configfiles=[Path(p) for p in configfiles]))._workflow
    rules = []
    for r in wf.rules:
        reports = [{"path": str(f), "caption": str(f.flags["report"].caption), "category": f.flags["report"].category}
                   for f in r.output if "report" in getattr(f, "flags", {})]
        rules.append({"name": r.name, "conda": r.conda_env and str(r.conda_env), "shell": bool(r.shellcmd),
                      "reports": reports})
print(json.dumps(rules))
"""


def workflow_rules(workdir: Path, *configfiles: Path) -> list[dict]:
    """Every rule of the workflow as Snakemake itself parses it (``use rule`` resolved): name,
    conda env, whether it runs a shell command, and its report() outputs (path, caption, category)."""
    res = subprocess.run(
        [sys.executable, "-c", _RULES_SCRIPT, str(REPO / "Snakefile"), str(workdir), *map(str, configfiles)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode:
        raise AssertionError(f"loading the workflow failed:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def pruned_cell(llama_dir, text_dataset, tmp_path_factory):
    """Grams (4 x 32 tokens) and a Wanda-sp 50 % keep set of the tiny Llama, in a folder."""
    from coec.calibrate.stage import run_calibrate
    from coec.select.stage import run_select

    d = tmp_path_factory.mktemp("cell")
    run_calibrate(
        CellSource(str(llama_dir), "float32", "cpu"),
        CalibrateOptions(CalibrationWindows(text_dataset, 4, 32, 0, 2), "float32"),
        str(d / "grams"),
    )
    run_select(
        CellSource(str(llama_dir)), str(d / "grams"), SelectOptions("wanda_sp", 0.5, "ceil"), str(d / "keep.json")
    )
    return d


# A cell whose row widths are partly multiples of the K-quant block (256) and partly not: hidden
# 256 (q/k/v/gate/up rows and the embedding take K-quants), block 0 keeps all 8 heads of 32 and
# 256 channels (o_proj / down_proj rows of 256), block 1 keeps 6 heads (o_proj rows of 192, a
# multiple of 32) and 200 channels (down_proj rows of 200, not a multiple of 32).
KQUANT_SHAPE = dict(
    hidden_size=256,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    intermediate_size=384,
    num_hidden_layers=2,
    initializer_range=0.05,
)
KQUANT_LAYERS = [
    {"kv_groups": [0, 1, 2, 3], "channels": list(range(256))},
    {"kv_groups": [0, 2, 3], "channels": sorted({*range(0, 384, 2), *range(1, 16, 2)})},
]


@pytest.fixture(scope="module")
def kquant_cell(tmp_path_factory):
    """(source model folder, keep.json, [compensation file]) of the K-quant cell above, with
    compensated o_proj / down_proj weights and biases."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("kquant-cell")
    src = make_model_dir(root / "src", "llama", **KQUANT_SHAPE)
    keep = root / "keep.json"
    keep.write_text(json.dumps({"layers": KQUANT_LAYERS}))
    g = torch.Generator().manual_seed(1)
    t = {}
    for i, k in enumerate(KQUANT_LAYERS):
        t[f"layer{i}.o_proj.weight"] = torch.randn(256, len(k["kv_groups"]) * 2 * 32, generator=g) * 0.05
        t[f"layer{i}.down_proj.weight"] = torch.randn(256, len(k["channels"]), generator=g) * 0.05
        t[f"layer{i}.o_proj.bias"] = torch.randn(256, generator=g) * 0.2
        t[f"layer{i}.down_proj.bias"] = torch.randn(256, generator=g) * 0.2
    comp = root / "block0-1.safetensors"
    save_file(t, str(comp))
    return src, keep, [comp]
