"""The claims report: every registered claim evaluated on a claims spec, as Markdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coec.io.atomic import write_text
from coec.iterative import claims as _iterative  # noqa: F401  (registers the iterative method's claims, first)
from coec.report.claims.core import CLAIMS, VERDICTS, Claim, NotTestable, Results
from coec.report.claims.paper import table4_beside_paper  # importing .paper registers the paper's claims

#: the columns of the report, in order (a claim's fields, then what was measured here)
COLUMNS = ("id", "paper", "section", "claim", "paper_figure", "ours", "verdict")


def registered_claims() -> list[Claim]:
    """Every registered claim, in registration order: the iterative method's
    (``coec.iterative.claims``), then the COEC paper's (``coec.report.claims.paper``)."""
    return list(CLAIMS.values())


def evaluate(spec: dict[str, Any], claims: list[Claim] | None = None) -> list[dict[str, str]]:
    """Each claim with ``ours`` and ``verdict`` (one of VERDICTS)."""
    res = Results(spec)
    out = []
    for c in registered_claims() if claims is None else claims:
        try:
            ours, verdict = c.check(res)
        except NotTestable as exc:
            ours, verdict = "–", f"not testable here: {exc}"
        except FileNotFoundError as exc:
            ours, verdict = "–", f"not testable here: missing result file {exc.filename}"
        out.append({**{k: getattr(c, k) for k in COLUMNS[:5]}, "ours": ours, "verdict": verdict})
    return out


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def claims_markdown(spec: dict[str, Any]) -> str:
    """The claims report (Markdown)."""
    rows = evaluate(spec)
    counts = {v: sum(r["verdict"].startswith(v) for r in rows) for v in VERDICTS}
    lines = [
        "# Claims of the papers against the results here",
        "",
        "Each claim is restated in one line; *paper* is the paper's own figure (its models and "
        "protocol), *here* the figure measured from this workflow's result files. "
        + ", ".join(f"{n} {v}" for v, n in counts.items())
        + ".",
        "",
        "| id | paper | section | claim | paper | here | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(_cell(r[k]) for k in COLUMNS) + " |" for r in rows]
    t4 = table4_beside_paper(spec)
    if t4:
        lines += [
            "",
            "## Table 4 beside the paper (same architectures)",
            "",
            "| model | quantity | paper | here | here − paper |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['model']} | {r['quantity']} | {r['paper']:.4g} | {r['ours']:.4g} | {r['difference']:+.3g} |"
            for r in t4
        ]
    return "\n".join(lines) + "\n"


def write_claims(spec: dict[str, Any], out: str | Path) -> str:
    text = claims_markdown(spec)
    write_text(out, text)
    return text
