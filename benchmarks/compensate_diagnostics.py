"""What the cheap methods' diagnostics cost: ``compensate()`` of method none and bias on real
module shapes, against the method's own arithmetic (``W0[:, K]``, ``W0[:, P] m_P``).

    python benchmarks/compensate_diagnostics.py [--repeats 5] [--threads 1]

Runs only the public ``compensate`` API, so the same script times two source trees (``PYTHONPATH=
<tree>/src``), e.g. before and after a change. Prints per shape and method the min / median of
``--repeats`` interleaved runs, and the method alone, in CPU seconds of this process
(``time.process_time``; on one thread this is the work done, whatever else the machine runs).
Synthetic statistics: a Gram of ``4 d_in`` random tokens (its values do not change the cost).
Where the tree has the calibration's Gram check (``coec.compensate.gram_check``), it also times
both methods given the module's check, as a compensation job of the workflow runs them, and the
check itself (formed once per calibration, not per job).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from coec.compensate import compensate

try:
    from coec.compensate.method import check_module
except ImportError:  # a tree from before the Gram check
    check_module = None

# (name, d_out, d_in, kept columns): the embedded SmolLM2-135M at 30 % and a Qwen2.5-0.5B down_proj
SHAPES = [
    ("smollm2 o_proj", 576, 576, 384),
    ("smollm2 down_proj", 576, 1536, 1076),
    ("qwen2.5-0.5b down_proj", 896, 4864, 3405),
]


def problem(d_out: int, d_in: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n = 4 * d_in
    X = torch.randn(n, d_in, generator=g)
    G = (X.T @ X).double()
    mean = X.mean(0).double()
    W0 = torch.randn(d_out, d_in, generator=g) / d_in**0.5
    keep = torch.sort(torch.randperm(d_in, generator=g)[:k]).values
    return W0, G, mean, keep, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(f"threads={torch.get_num_threads()} repeats={a.repeats} (CPU seconds: min / median)")
    for name, d_out, d_in, k in SHAPES:
        W0, G, mean, keep, n = problem(d_out, d_in, k)
        mask = torch.ones(d_in, dtype=torch.bool)
        mask[keep] = False
        times: dict[str, list[float]] = {"none": [], "bias": [], "method alone": []}
        if check_module is not None:
            times.update({"check (once)": [], "none checked": [], "bias checked": []})
        for _ in range(a.repeats):  # interleaved, so load changes hit every column alike
            for method in ("none", "bias"):
                t = time.process_time()
                compensate(W0, G, mean, keep, method, n_tokens=n)
                times[method].append(time.process_time() - t)
            if check_module is not None:
                t = time.process_time()
                check = check_module(W0, G)
                times["check (once)"].append(time.process_time() - t)
                for method in ("none", "bias"):
                    t = time.process_time()
                    compensate(W0, G, mean, keep, method, n_tokens=n, check=check)
                    times[f"{method} checked"].append(time.process_time() - t)
            t = time.process_time()
            W64 = W0.double()
            W64[:, keep], W64[:, mask] @ mean[mask]
            times["method alone"].append(time.process_time() - t)
        cells = "  ".join(f"{m} {min(v):.4f} / {statistics.median(v):.4f}" for m, v in times.items())
        print(f"{name:24s} d_out={d_out} d_in={d_in} k={k}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
