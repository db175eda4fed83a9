"""What the errors of a compensated module need that no method changes, formed once per calibration.

Every method without errors of its own (``Method.reports_errors`` false: none, bias, lstsq, rcpu,
blend) reports them on the float64 metric: the Gram normalised to unit mean diagonal and
PSD-checked (App. B: a power iteration and a Cholesky of ``G + 1e-4 lambda_max I``, an eigh
only when that fails), with the output energy ``c = tr(W0 G W0^T)`` (one ``d_out d_in^2``
product). Neither depends on the selection, the ratio or the method, yet without this module every
compensation job formed both again: for ``none`` and ``bias``, which only slice and add, they
were nearly all of the job.

The ``gram_check`` stage forms them once per (model, calibration) with the code the compensation
job would run (``method.check_module``: ``method.form_metric`` and ``errors.output_energy``).
Each job is given its module's :class:`GramCheck` (``compensate(..., check=check)``) and
``method.prepare`` uses it when it was formed from the same Gram and the same weight (``fits_gram`` /
``fits_weight``: trace and Frobenius norms in float64, to ``FINGERPRINT_RTOL``), else forms them
itself and says so in its log. Results are those of the job forming them itself: the same
functions on the same tensors.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from coec.compensate.gram import gram_scale

#: Relative agreement of a check's fingerprints with the job's Gram and weight: far below any
#: change of data, far above the reordered sums of another thread count.
FINGERPRINT_RTOL = 1e-9


def frobenius(A: torch.Tensor) -> float:
    """``||A||_F`` in float64 (no float64 copy of A)."""
    return float(torch.linalg.vector_norm(A, dtype=torch.float64))


def _close(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= FINGERPRINT_RTOL * max(abs(a), abs(b))


@dataclass(frozen=True)
class GramCheck:
    """App. B's outcome for one module's Gram and the module's output energy on the metric.

    scale: ``tr(G) / d`` of the Gram as calibrated (the normalisation's divisor); gram_norm and
    weight_norm: ``||G||_F`` of that Gram and ``||W0||_F`` of the weight (float64 fingerprints);
    psd: ``gram_psd``'s info (``info["gram_psd"]`` of every result); energy: ``c`` on the
    normalised, PSD-checked metric, or None where it is not finite.
    """

    scale: float
    gram_norm: float
    weight_norm: float
    psd: dict[str, Any]
    energy: float | None

    def fits_gram(self, gram: torch.Tensor) -> bool:
        """Whether this check was formed from ``gram`` (d, d): its ``gram_scale`` and Frobenius
        norm, both in float64, agree to ``FINGERPRINT_RTOL``."""
        return _close(self.scale, gram_scale(gram)) and _close(self.gram_norm, frobenius(gram))

    def fits_weight(self, W0: torch.Tensor) -> bool:
        """Whether this check's energy is that of ``W0`` (d_out, d_in)."""
        return self.energy is not None and _close(self.weight_norm, frobenius(W0))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> GramCheck:
        """The inverse of ``to_json``; ValueError naming the key that is missing or not a number."""
        if not isinstance(obj, dict):
            raise ValueError(f"expected an object, found {type(obj).__name__}")
        for key in ("scale", "gram_norm", "weight_norm"):
            if not isinstance(obj.get(key), (int, float)) or isinstance(obj.get(key), bool):
                raise ValueError(f"{key} is not a number")
        energy = obj.get("energy")
        if energy is not None and (not isinstance(energy, (int, float)) or isinstance(energy, bool)):
            raise ValueError("energy is not a number")
        psd = obj.get("psd")
        if not isinstance(psd, dict) or not isinstance(psd.get("indefinite"), bool):
            raise ValueError("psd.indefinite is not a boolean")
        return cls(
            scale=float(obj["scale"]),
            gram_norm=float(obj["gram_norm"]),
            weight_norm=float(obj["weight_norm"]),
            psd=dict(psd),
            energy=float(energy) if energy is not None else None,
        )
