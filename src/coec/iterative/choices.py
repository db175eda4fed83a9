"""The choices of the iterative method's options: read by the method and by the ``coec
iterative`` parser (``coec.iterative.cli``), so no torch here."""

from __future__ import annotations

#: how the layers are pruned: all at once from one pass (global) or layer by layer (sequential)
MODES = ("global", "sequential")
#: uniform widths, or per-layer widths from one ranking over every layer (AL-AM)
STRUCTURES = ("uniform", "al-am")
#: how the domains' statistics mix (``coec.iterative.stats``; eq. 8)
VARIANCE_MIXES = ("pooled", "eq8")
