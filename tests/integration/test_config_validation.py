"""Bad config input refused early, in one line: names (shell-safe, never '..'), every compensation
option (typed, coec.compensate.options), the model's geometry (layers, heads, sequence length);
shell-quoted commands; an indefinite Gram handled as App. B says, with no logging errors."""

from __future__ import annotations

import copy
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from coec.compensate.method import METHODS
from coec.compensate.options_doc import markdown
from coec.config.validate import ConfigError, registry_schema, validate_config
from conftest import CORPUS, make_model_dir, snakemake

REPO = Path(__file__).resolve().parents[2]
LOGGING_ERROR = "--- Logging error ---"


def _merge(a: dict, b: dict) -> dict:
    """Snakemake's --configfile merge: nested dicts updated, everything else replaced."""
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            _merge(a[k], v)
        else:
            a[k] = v
    return a


def default_config() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def refused(cfg: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        validate_config(cfg)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("config: ")
    return msg


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer llama (4 heads, 2 KV heads, max_position_embeddings 256)."""
    return make_model_dir(tmp_path_factory.mktemp("cfg") / "tiny", "llama")


def tiny_config(model: Path, work: Path) -> dict:
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    return {
        "models": {"tiny": {"source": str(model), "num_layers": 2}},
        "datasets": {"local": {"source": "files", "calib": str(work / "calib.txt"), "eval": str(work / "eval.txt")}},
        "calibration": {"c8": {"dataset": "local", "nsamples": 8, "seqlen": 32}},
        "evaluation": {"ppl_dataset": "local", "ppl_seqlen": 32, "ppl_max_windows": 2},
        "compensations": {"coec": {"method": "coec", "max_rounds": 2, "o_proj": {"align_lambda": 50.0}}},
        "compute": {"device": "cpu"},
        "table1": {
            "calibration": "c8",
            "models": ["tiny"],
            "ratios": [0.5],
            "rows": [{"selection": "wanda_sp", "compensation": "coec"}],
        },
    }


# ----------------------------------------------------------------------------- config validation
def test_shipped_configs_validate():
    validate_config(default_config())
    validate_config(_merge(default_config(), yaml.safe_load((REPO / "workflow/configs/paper.yaml").read_text())))


@pytest.mark.parametrize(
    "section, name",
    [
        ("models", "t$(touch${IFS}PWNED)"),
        ("calibration", ".."),
        ("calibration", "."),
        ("datasets", "a/b"),
        ("compensations", "-x"),
        ("compensations", "c d"),
        ("extra_tables", "t;ls"),
    ],
)
def test_names_are_shell_and_path_safe(section, name):
    cfg = default_config()
    cfg[section][name] = copy.deepcopy(next(iter(cfg[section].values())))
    msg = refused(cfg)
    assert f"bad name {name!r} under {section}" in msg


def test_iterative_names_are_checked():
    cfg = default_config()
    cfg["iterative"]["mixes"]["../up"] = cfg["iterative"]["mixes"]["mix3-32x512"]
    assert "under iterative.mixes" in refused(cfg)


@pytest.mark.parametrize(
    "comp, key, value, expect",
    [
        (
            "coec",
            "alpah",
            0.5,
            "compensations.coec.alpah: unknown option 'alpah' for method 'coec'; did you mean 'alpha'?",
        ),
        ("coec", "alpha", 1.5, "compensations.coec.alpha: option alpha must be <= 1"),
        ("coec", "rescale", "median", "compensations.coec.rescale: option rescale must be one of"),
        ("coec", "max_rounds", 2.5, "compensations.coec.max_rounds: option max_rounds must be a finite integer"),
        ("coec", "psd_clip", "yes", "compensations.coec.psd_clip: option psd_clip must be a bool"),
        ("coec", "gcv_grid", [1.0, 0.1, 10], "compensations.coec.gcv_grid: option gcv_grid needs lo < hi"),
        ("coec", "device", "cuda", "compensations.coec.device: unknown option 'device' for method 'coec'"),
        ("coec", "value_proj", None, "compensations.coec.value_proj: unknown option 'value_proj' for method 'coec'"),
        ("coec", "align_lambda", 5.0, "compensations.coec.align_lambda: align_lambda > 0 with align 'projector'"),
        (
            "coec-pcg",
            "eta_scale",
            "raw",
            "compensations.coec-pcg.precondition: 'gram' needs right: stiefel and eta_scale: rayleigh",
        ),
        ("coec-pcg", "right", "full", "compensations.coec-pcg.precondition: 'gram' needs right: stiefel"),
        ("lstsq", "ridge", -1.0, "compensations.lstsq.ridge: option ridge must be >= 0"),
        ("lstsq", "alpha", 0.9, "compensations.lstsq.alpha: unknown option 'alpha' for method 'lstsq'"),
        ("rcpu", "compute_dtype", "float16", "compensations.rcpu.compute_dtype: option compute_dtype must be"),
        ("none", "max_rounds", 3, "compensations.none.max_rounds: unknown option 'max_rounds' for method 'none'"),
    ],
)
def test_every_compensation_option_checked(comp, key, value, expect):
    cfg = default_config()
    cfg["compensations"][comp][key] = value
    assert expect in refused(cfg)


def test_module_overrides_checked():
    cfg = default_config()
    cfg["compensations"]["coec"]["o_proj"] = {"align_lamda": 50.0}
    assert (
        "compensations.coec.o_proj.align_lamda: unknown option 'align_lamda' for method 'coec'; "
        "did you mean 'align_lambda'?" in refused(cfg)
    )
    cfg = default_config()
    cfg["compensations"]["coec"]["down_proj"] = {"kappa": 0.5}
    assert "compensations.coec.down_proj.kappa: option kappa must be >= 1" in refused(cfg)
    cfg = default_config()
    cfg["compensations"]["coec"]["down_proj"] = {"align_lambda": 5.0}
    assert "compensations.coec.down_proj.align_lambda: align_lambda > 0" in refused(cfg)
    cfg = default_config()
    cfg["compensations"]["coec"]["down_proj"] = {"align_lambda": 5.0, "align": "angle"}
    validate_config(cfg)  # the angle penalty needs no v_proj
    cfg = default_config()
    cfg["compensations"]["bias"]["o_proj"] = "none"
    assert "compensations.bias.o_proj: 'none' is not of type 'object'" in refused(cfg)


def test_options_resolve_keeps_values_and_defaults():
    from coec.compensate import options

    o = options.resolve("coec", {"alpha": 1, "gcv_grid": [1e-3, 1e4, 50]})
    assert o.alpha == 1 and isinstance(o.alpha, int)  # no coercion: the solver sees what was given
    assert o.gcv_grid == (1e-3, 1e4, 50) and o.max_rounds == 50 and o.kappa == 10.0  # a YAML list -> tuple
    assert {f.name: f.default for f in options.option_fields("lstsq")} == {"compute_dtype": None, "ridge": 1e-2}
    for method in METHODS:
        for f in options.option_fields(method):
            assert f.metadata["group"] in ("paper", "method", "solver") and f.metadata["doc"], f.name
            f.metadata["check"](f.name, f.default)  # every default passes its own check
    with pytest.raises(ValueError, match="did you mean 'max_rounds'"):
        options.resolve("coec", {"max_round": 3})
    from coec.config.validate import SCHEMA

    schema = registry_schema(SCHEMA)
    methods = schema["properties"]["compensations"]["additionalProperties"]["properties"]["method"]["enum"]
    assert tuple(methods) == METHODS.names()


def test_planned_options_are_each_modules_resolved_options():
    """The compensate stage's options (``options.planned``): each module's as ``resolve`` gives
    them for a validated entry, built once without checking the values again (the config
    validation did); an unknown key still stops with the closest valid name."""
    from coec.compensate import options

    spec = {"method": "coec", "alpha": 0.8, "gcv_grid": [1e-3, 1e4, 50], "o_proj": {"align_lambda": 50.0}, "inputs": {}}
    options.validate_spec(spec, "compensations.coec")
    planned = options.planned(spec)
    for module in ("o_proj", "down_proj"):
        assert planned[module].method.name == "coec"
        assert planned[module].options == options.resolve("coec", options.module_options(spec, module))
    assert planned["o_proj"].options.align_lambda == 50.0 and planned["down_proj"].options.align_lambda == 0.0
    assert options.planned({"method": "coec", "alpha": 5.0})["o_proj"].options.alpha == 5.0  # trusted, not checked
    with pytest.raises(ValueError, match="did you mean 'alpha'"):
        options.planned({"method": "coec", "alpah": 0.8})


def test_doc_matches_the_dataclasses():
    """docs/compensation-options.md is generated from the dataclasses and lists exactly their fields."""
    from coec.compensate import options

    doc = (REPO / "docs/compensation-options.md").read_text()
    assert doc == markdown(), "regenerate it: python -m coec.compensate.options_doc > docs/compensation-options.md"
    for method in METHODS:
        section = doc.split(f"## `{method}`")[1].split("\n## ")[0]
        listed = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
        assert sorted(listed) == sorted(f.name for f in options.option_fields(method))


# ----------------------------------------------------------------------------- model geometry
def test_geometry_checked_at_config_time(tiny_model, tmp_path):
    cfg = tiny_config(tiny_model, tmp_path)
    validate_config(copy.deepcopy(cfg))
    bad = copy.deepcopy(cfg)
    bad["models"]["tiny"]["num_layers"] = 1
    assert refused(bad) == (
        f"config: models.tiny.num_layers = 1 but the model's config.json ({tiny_model}) has num_hidden_layers = 2"
    )
    bad["models"]["tiny"]["num_layers"] = 5
    assert "models.tiny.num_layers = 5" in refused(bad)
    bad = copy.deepcopy(cfg)
    bad["evaluation"]["ppl_seqlen"] = 512
    assert "evaluation.ppl_seqlen = 512 but the model's config.json" in refused(bad)
    assert "has max_position_embeddings = 256" in refused(bad)
    bad = copy.deepcopy(cfg)
    bad["calibration"]["c8"]["seqlen"] = 300
    assert "calibration.c8.seqlen = 300 but" in refused(bad)
    bad["table1"]["models"] = ["smollm2-135m"]  # c8 no longer used with the tiny model
    bad["models"]["smollm2-135m"] = {"source": "embedded", "num_layers": 30}
    validate_config(bad)


def test_embedded_geometry_checked_at_config_time():
    cfg = default_config()
    cfg["models"]["smollm2-135m"]["num_layers"] = 5
    assert refused(cfg) == (
        "config: models.smollm2-135m.num_layers = 5 but the embedded model 'smollm2-135m' has num_hidden_layers = 30"
    )
    cfg = default_config()
    cfg["evaluation"]["ppl_seqlen"] = 10000
    assert "evaluation.ppl_seqlen = 10000" in refused(cfg)


def _coec(*args) -> subprocess.CompletedProcess:
    """A stage as the workflow runs it: its own process (stderr holds any logging error)."""
    return subprocess.run([sys.executable, "-m", "coec", *args], capture_output=True, text=True, timeout=600)


def _stage(capsys, *args) -> tuple[int, str]:
    """A stage in this process (faster): (exit code, stderr)."""
    from coec.cli import main

    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def grams(tiny_model, tmp_path_factory):
    """Grams and a Wanda-sp 50 % keep.json of the tiny model (the stages' own CLI)."""
    from coec.cli import main

    work = tmp_path_factory.mktemp("stages")
    (work / "calib.txt").write_text(CORPUS)
    ds = json.dumps({"source": "files", "calib": str(work / "calib.txt"), "eval": str(work / "calib.txt")})
    assert (
        main(
            [
                "calibrate",
                "--model",
                str(tiny_model),
                "--dataset",
                ds,
                "--nsamples",
                "8",
                "--seqlen",
                "32",
                "--device",
                "cpu",
                "--gram-dtype",
                "float64",
                "--out",
                str(work / "grams"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "select",
                "--model",
                str(tiny_model),
                "--grams",
                str(work / "grams"),
                "--method",
                "wanda_sp",
                "--ratio",
                "0.5",
                "--out",
                str(work / "keep.json"),
            ]
        )
        == 0
    )
    return work, ds


def test_geometry_checked_when_a_stage_starts(tiny_model, grams, tmp_path, capsys):
    """Hub models are known only when their stage runs: each stage compares before any work."""
    work, ds = grams
    expect = json.dumps({"model": "models.tiny", "num_layers": 1})
    out = tmp_path / "g"
    rc, err = _stage(
        capsys,
        "calibrate",
        "--model",
        str(tiny_model),
        "--dataset",
        ds,
        "--nsamples",
        "2",
        "--seqlen",
        "16",
        "--device",
        "cpu",
        "--expect",
        expect,
        "--out",
        str(out),
    )
    assert rc == 2 and not out.exists()
    assert "models.tiny.num_layers = 1 but the model's config.json" in err
    assert "has num_hidden_layers = 2" in err and "Traceback" not in err
    rc, err = _stage(
        capsys,
        "ppl",
        "--model",
        str(tiny_model),
        "--dataset",
        ds,
        "--seqlen",
        "300",
        "--device",
        "cpu",
        "--expect",
        json.dumps({"model": "models.tiny", "seqlen_key": "evaluation.ppl_seqlen"}),
        "--out",
        str(tmp_path / "ppl.json"),
    )
    assert rc == 2 and "evaluation.ppl_seqlen = 300 but the model's config.json" in err
    assert "max_position_embeddings = 256" in err
    rc, err = _stage(
        capsys,
        "iterative",
        "grams",
        "--model",
        str(tiny_model),
        "--domains",
        json.dumps([{"name": "local", "alpha": 1.0, "dataset": json.loads(ds)}]),
        "--nsamples",
        "2",
        "--seqlen",
        "16",
        "--expect",
        expect,
        "--out",
        str(out),
    )
    assert rc == 2 and "models.tiny.num_layers = 1 but" in err and not out.exists()
    # a keep.json of another geometry (here: 3 layers) is refused before any work
    keep = json.loads((work / "keep.json").read_text())
    keep["layers"].append(keep["layers"][0])
    (tmp_path / "keep3.json").write_text(json.dumps(keep))
    rc, err = _stage(
        capsys,
        "compensate",
        "--model",
        str(tiny_model),
        "--grams",
        str(work / "grams"),
        "--keep",
        str(tmp_path / "keep3.json"),
        "--spec",
        '{"method": "none"}',
        "--first",
        "0",
        "--last",
        "2",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "b.safetensors"),
    )
    assert rc == 2 and "layers = 3 but the model's config.json" in err
    assert not (tmp_path / "b.safetensors").exists()


# ----------------------------------------------------------------------------- indefinite Gram
def _make_indefinite(gram_dir: Path, out: Path, layer: int = 0) -> None:
    """Copy a Gram folder with G - 0.5 lambda_max I for both modules of one layer."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(gram_dir, out)
    path = out / f"layer{layer}.safetensors"
    t = load_file(str(path))
    for m in ("o_proj", "down_proj"):
        G = t[f"{m}.gram"]
        lam = float(torch.linalg.eigvalsh(G.double()).max())
        t[f"{m}.gram"] = (G - 0.5 * lam * torch.eye(G.shape[0], dtype=G.dtype)).contiguous()
    save_file(t, str(path))


@pytest.mark.parametrize("method", ["none", "bias", "lstsq", "rcpu", "coec"])
def test_indefinite_gram_every_method(method):
    """G - 0.5 lambda_max I: every method finite, errors finite and >= 0 on the PSD projection."""
    from coec.compensate import compensate

    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 32, generator=g, dtype=torch.float64)
    G = X.T @ X
    Gi = G - 0.5 * float(torch.linalg.eigvalsh(G).max()) * torch.eye(32, dtype=torch.float64)
    W0 = torch.randn(24, 32, generator=g, dtype=torch.float64)
    keep = torch.arange(0, 32, 2)
    kw = {"max_rounds": 5} if method == "coec" else {}
    out = compensate(W0, Gi, X.mean(0), keep, method, n_tokens=400, **kw)
    assert bool(torch.isfinite(out.weight).all())
    info = json.loads(json.dumps(out.info, allow_nan=False))
    psd = info["gram_psd"]
    assert psd["indefinite"] and psd["clipped"] >= 1 and psd["min_eig"] < -0.1 * psd["max_eig"]
    for key in ("relerr_before", "relerr_after"):
        assert isinstance(info[key], float) and info[key] >= 0.0, (key, info[key])
    # on a PSD Gram nothing is projected and nothing is recorded beyond the verdict
    ok = compensate(W0, G, X.mean(0), keep, method, n_tokens=400, **kw).info["gram_psd"]
    assert ok["indefinite"] is False and "clipped" not in ok


def _compensate_args(model, grams_dir, keep, spec, out, *extra) -> list[str]:
    """``coec compensate`` of layers 0-1 on the CPU (``extra``: more options)."""
    return [
        "compensate",
        "--model",
        str(model),
        "--grams",
        str(grams_dir),
        "--keep",
        str(keep),
        "--spec",
        json.dumps(spec),
        "--first",
        "0",
        "--last",
        "1",
        "--device",
        "cpu",
        *extra,
        "--out",
        str(out),
    ]


@pytest.mark.parametrize("method", ["none", "coec"])
def test_indefinite_gram_in_the_compensate_stage(tiny_model, grams, tmp_path, method):
    """App. B: negative eigenvalues clipped (recorded in info["gram_psd"]), finite errors on the
    PSD projection, and no logging error anywhere in the stage's output."""
    work, _ = grams
    _make_indefinite(work / "grams", tmp_path / "grams")
    spec = {"method": method, **({"max_rounds": 3} if method == "coec" else {})}
    out = tmp_path / "block0-1.safetensors"
    res = _coec(*_compensate_args(tiny_model, tmp_path / "grams", work / "keep.json", spec, out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert LOGGING_ERROR not in res.stderr + res.stdout
    info = json.loads(out.with_suffix(".json").read_text())
    for module in ("o_proj", "down_proj"):
        i0, i1 = info[f"layer0.{module}"], info[f"layer1.{module}"]
        psd = i0["gram_psd"]
        assert psd["indefinite"] is True and psd["clipped"] >= 1 and psd["min_eig"] < 0
        assert "clipped negative eigenvalues" in psd["action"]
        assert i1["gram_psd"]["indefinite"] is False  # the untouched layer is left as it is
        for key in ("relerr_before", "relerr_after"):
            assert isinstance(i0[key], float) and math.isfinite(i0[key]) and i0[key] >= -1e-9, (key, i0[key])
    assert "indefinite Gram: PSD projection" in res.stderr


# ----------------------------------------------------------------------------- the Gram check
def _compensate_stage(capsys, model, grams_dir, keep, spec, out, *extra) -> tuple[int, str]:
    return _stage(capsys, *_compensate_args(model, grams_dir, keep, spec, out, *extra))


def test_compensate_stage_with_the_gram_check_writes_the_files_it_writes_without(tiny_model, grams, tmp_path, capsys):
    """``coec gram-check`` once, then every method without errors of its own: the same block and
    info bytes as the job forming App. B's check and the output energy itself, on a PSD layer
    and an indefinite one. A bad check file is refused in one line naming it, nothing written."""
    work, _ = grams
    _make_indefinite(work / "grams", tmp_path / "grams")
    check = tmp_path / "gram_check.json"
    rc, err = _stage(
        capsys, "gram-check", "--model", str(tiny_model), "--grams", str(tmp_path / "grams"), "--device", "cpu",
        "--out", str(check),
    )  # fmt: skip
    assert rc == 0, err
    layers = json.loads(check.read_text())["layers"]
    assert [layer["o_proj"]["psd"]["indefinite"] for layer in layers] == [True, False]
    for spec in ({"method": "none"}, {"method": "bias"}, {"method": "lstsq", "ridge": 0.01}, {"method": "rcpu"}):
        name = spec["method"]
        outs = {}
        for variant, extra in (("without", ()), ("with", ("--gram-check", str(check)))):
            out = tmp_path / variant / name / "block0-1.safetensors"
            rc, err = _compensate_stage(capsys, tiny_model, tmp_path / "grams", work / "keep.json", spec, out, *extra)
            assert rc == 0, err
            assert "formed from another" not in err
            outs[variant] = (out.read_bytes(), out.with_suffix(".json").read_bytes())
        assert outs["with"] == outs["without"], name
    bad = tmp_path / "bad_check.json"
    obj = json.loads(check.read_text())
    obj["layers"] = obj["layers"][:1]
    bad.write_text(json.dumps(obj))
    out = tmp_path / "refused" / "block0-1.safetensors"
    rc, err = _compensate_stage(capsys, tiny_model, tmp_path / "grams", work / "keep.json", {"method": "none"}, out,
                                "--gram-check", str(bad))  # fmt: skip
    lines = [ln for ln in err.splitlines() if ln.startswith("coec compensate: error:")]
    assert rc == 2 and len(lines) == 1 and str(bad) in lines[0] and "has 1 layers, the model 2" in lines[0]
    assert not out.exists()


# ----------------------------------------------------------------------------- the workflow
def _error_lines(res) -> list[str]:
    return [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("config: ")]


DRY_RUN_CASES = {
    "name": (
        lambda c: c["models"].__setitem__("t$(touch${IFS}PWNED)", c["models"].pop("tiny")),
        "bad name 't$(touch${IFS}PWNED)' under models",
    ),
    "option": (
        lambda c: c["compensations"]["coec"].__setitem__("alpah", 0.5),
        "compensations.coec.alpah: unknown option 'alpah' for method 'coec'; did you mean 'alpha'?",
    ),
    "geometry": (
        lambda c: c["models"]["tiny"].__setitem__("num_layers", 1),
        "models.tiny.num_layers = 1 but the model's config.json",
    ),
}


@pytest.mark.parametrize("case", list(DRY_RUN_CASES))
def test_dry_run_refuses_bad_input_in_one_line(tiny_model, tmp_path, case):
    """`snakemake -n` names a bad name, option or geometry in one line, before any job."""
    mutate, expect = DRY_RUN_CASES[case]
    bad = tiny_config(tiny_model, tmp_path)
    mutate(bad)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    res = snakemake(tmp_path, "-n", "results/table1.csv", "--configfile", str(path), check=False)
    assert res.returncode != 0
    lines = _error_lines(res)
    assert len(lines) == 1 and expect in lines[0], res.stdout[-2000:] + res.stderr[-2000:]
    assert not list(tmp_path.rglob("PWNED"))


def test_shell_commands_quote_every_path_and_value(tiny_model, tmp_path):
    """A config value with shell syntax stays one word in every planned command."""
    cfg = tiny_config(tiny_model, tmp_path)
    weird = "cpu$(touch PWNED);x"  # (braces would be read as a wildcard by Snakemake)
    cfg["compute"]["device"] = weird
    cfg["models"]["tiny"]["device_map"] = "auto; touch PWNED2"
    cfg["evaluation"]["zeroshot_tasks"] = ["boolq", "rte"]  # a closed enum: no shell syntax
    cfg["table2"] = dict(cfg["table1"])
    path = tmp_path / "weird.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = snakemake(
        tmp_path, "-n", "-p", "results/table1.csv", "results/table2.csv", "--configfile", str(path), check=False
    )
    assert res.returncode == 0, res.stderr[-3000:]
    commands = [line.strip() for line in res.stdout.splitlines() if "OMP_NUM_THREADS=" in line]
    assert len(commands) >= 5
    for cmd in commands:
        words = shlex.split(cmd)
        if "--device" in words:
            assert words[words.index("--device") + 1] == weird, cmd
        if "--device-map" in words:
            assert words[words.index("--device-map") + 1] == "auto; touch PWNED2", cmd
        if "--tasks" in words:
            i = words.index("--tasks")
            assert words[i + 1 : i + 3] == ["boolq", "rte"], cmd
