"""What starting a job costs: every job of the workflow runs ``python -m coec <stage>``, and
``coec --help`` is the floor of each (the parser built, no stage run).

    python benchmarks/startup.py [--repeat 5] [--baseline /path/to/other/checkout]

Prints, for this checkout and (with ``--baseline``) another one, each in fresh interpreters with
``PYTHONPATH=<checkout>/src``: the wall time of ``python -m coec --help`` (best of ``--repeat``),
the time of ``import coec.cli`` measured inside the interpreter (best of ``--repeat``), the
number of modules that import loads and which of torch, transformers, pandas, lm_eval, numpy
and safetensors it loads (none, on the job boundary: tests/unit/test_imports.py). The checkouts
are measured alternately, so that a change of machine load reaches both; the load average is
printed beside.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "pandas", "lm_eval", "numpy", "safetensors")
IMPORT = f"""
import sys, time
before = set(sys.modules)
t0 = time.perf_counter()
import coec.cli
t = time.perf_counter() - t0
print(t, len(set(sys.modules) - before), ",".join(m for m in {HEAVY} if m in sys.modules) or "-")
"""


def env_for(checkout: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COEC_PLUGINS"}
    env["PYTHONPATH"] = str(checkout / "src")
    return env


def help_seconds(checkout: Path) -> float:
    """Wall time of one ``python -m coec --help``."""
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "coec", "--help"], env=env_for(checkout), stdout=subprocess.DEVNULL, check=True
    )
    return time.perf_counter() - t0


def import_stats(checkout: Path) -> tuple[float, int, str]:
    """(seconds, modules loaded, heavy libraries loaded) of ``import coec.cli`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORT], env=env_for(checkout), capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[0]), int(out[1]), out[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs of each measurement (the best counts)")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout (its src/ is imported)")
    a = ap.parse_args()
    trees = {"this checkout": REPO}
    if a.baseline is not None:
        trees["baseline"] = a.baseline.resolve()
    help_s: dict[str, list[float]] = {k: [] for k in trees}
    imports: dict[str, list[tuple[float, int, str]]] = {k: [] for k in trees}
    load0 = os.getloadavg()[0]
    for _ in range(a.repeat):  # alternately: the same machine load for both
        for name, path in trees.items():
            help_s[name].append(help_seconds(path))
            imports[name].append(import_stats(path))
    load1 = os.getloadavg()[0]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load0:.2f} -> {load1:.2f}")
    print(f"best of {a.repeat}; `import coec.cli` timed inside the interpreter, `coec --help` by wall clock")
    print(f"{'checkout':<15} {'coec --help (s)':>15} {'import (s)':>11} {'modules':>8}  heavy libraries loaded  path")
    for name, path in trees.items():
        best_import = min(t for t, _, _ in imports[name])
        _, modules, heavy = imports[name][0]
        print(f"{name:<15} {min(help_s[name]):>15.3f} {best_import:>11.3f} {modules:>8}  {heavy:<22}  {path}")


if __name__ == "__main__":
    main()
