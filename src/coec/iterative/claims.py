"""The iterative multi-domain FLAP paper's claims, registered in ``coec.report.claims.core.CLAIMS`` (read
from ``table_iterative`` and the iterative calibration-size figure)."""

from __future__ import annotations

import math
from itertools import pairwise

from coec.report.claims.core import (
    CLAIMS,
    Check,
    Claim,
    NotTestable,
    Results,
    Verdict,
    all_hold,
    as_float,
    every,
    lower,
)

ITER = "iterative multi-domain FLAP"


def _it_rows(res: Results, label: str) -> dict[tuple[float, str], float]:
    out = {}
    for r in res.table("table_iterative", "iterative.table (table_iterative)", ("ratio", "method")):
        if r["method"] == label and math.isfinite(r["value"]):
            out[(as_float(r["ratio"]), r["model"])] = r["value"]
    if not out:
        raise NotTestable(f"iterative.table has no row labelled {label!r}")
    return out


def _it_beats(ours: str, base: str, only_top: bool = False) -> Check:
    def check(res: Results) -> Verdict:
        a, b = _it_rows(res, ours), _it_rows(res, base)
        keys = sorted(set(a) & set(b))
        if only_top:
            top = max(k[0] for k in keys)
            keys = [k for k in keys if k[0] == top]
        pairs = {f"{m} {r * 100:g} %": (b[(r, m)], a[(r, m)]) for r, m in keys}
        return every(pairs, lower)

    return check


def _it_gap_grows(res: Results) -> Verdict:
    a, b = _it_rows(res, "iterative + multi-domain"), _it_rows(res, "FLAP")
    keys = sorted(set(a) & set(b))
    models = sorted({m for _, m in keys})
    parts, ok = [], True
    for m in models:
        gaps = [(r, b[(r, mm)] - a[(r, mm)]) for r, mm in keys if mm == m]
        if len(gaps) < 2:
            continue
        parts.append(f"{m}: " + ", ".join(f"{r * 100:g} % {g:.4g}" for r, g in gaps))
        ok &= all(x[1] < y[1] for x, y in pairwise(gaps))
    if not parts:
        raise NotTestable("iterative.table needs two or more ratios")
    return "; ".join(parts), "holds" if ok else "does not hold"


def _it_size(kind: str) -> Check:
    def check(res: Results) -> Verdict:
        panels = res.curves("iterative_size", "iterative.calibration_size")
        parts, ok = [], True
        for panel, lines in panels.items():
            if "FLAP" not in lines or len(lines) < 2:
                raise NotTestable("iterative.calibration_size needs a FLAP row and an iterative row")
            it = next(label for label in lines if label != "FLAP")
            f, i = sorted(lines["FLAP"]), sorted(lines[it])
            if kind == "more":
                good = f[-1][1] < f[0][1] and i[-1][1] < i[0][1]
                parts.append(
                    f"{panel}: FLAP {f[0][1]:.4g} → {f[-1][1]:.4g}, {it} {i[0][1]:.4g} → {i[-1][1]:.4g}"
                    f" (N {f[0][0]} → {f[-1][0]})"
                )
            else:
                good = all(b < a for (_, a), (_, b) in zip(f, i, strict=False))
                parts.append(
                    f"{panel}: FLAP − {it} = "
                    + ", ".join(f"N={n} {a - b:.4g}" for (n, a), (_, b) in zip(f, i, strict=False))
                )
            ok &= good
        return "; ".join(parts), "holds" if ok else "does not hold"

    return check


for _id, _section, _text, _figure, _check in [
    (
        "iter-beats-flap",
        "Results, Tables 1-2",
        "Iterative multi-domain FLAP has lower perplexity than FLAP (bias) at every ratio and model",
        "consistently better; gain up to 10.06 % (Qwen2.5-32B, 50 %)",
        _it_beats("iterative + multi-domain", "FLAP"),
    ),
    (
        "iter-gap-grows",
        "Results, Tables 1-2",
        "The advantage over FLAP widens with the pruning ratio",
        "Qwen2.5-32B: 1.85 % at 25 %, 10.06 % at 50 %",
        _it_gap_grows,
    ),
    (
        "iter-high-sparsity",
        "Fig. 3",
        "At the highest ratio the method beats both Wanda-sp and FLAP",
        "Qwen2.5-7B 50 %: 24.2 vs Wanda-sp > 6800, FLAP > 106",
        lambda res: all_hold(
            _it_beats("iterative + multi-domain", "Wanda-sp", True)(res),
            _it_beats("iterative + multi-domain", "FLAP", True)(res),
        ),
    ),
    (
        "iter-ablation-iterative",
        "Ablation",
        "Iterative recalibration alone improves on one-shot FLAP",
        "claimed, no number given",
        _it_beats("iterative", "FLAP"),
    ),
    (
        "iter-ablation-multidomain",
        "Ablation",
        "Multi-domain calibration alone improves on FLAP",
        "claimed, no number given",
        _it_beats("multi-domain", "FLAP"),
    ),
    (
        "iter-calib-more",
        "Fig. 2",
        "FLAP and the iterative method both improve with more calibration samples",
        "iterative ≈ 52 at N = 32, ≈ 50 at N ≥ 128 (Qwen2.5-7B, 50 %)",
        _it_size("more"),
    ),
    (
        "iter-calib-beats",
        "Fig. 2",
        "The iterative method beats FLAP at every calibration size",
        "every N; FLAP > 170 at 50 %",
        _it_size("beats"),
    ),
]:
    CLAIMS.register(Claim(_id, ITER, _section, _text, _figure, _check))
