"""The claims report (results/claims.md): every claim of the papers this repository reproduces,
restated in one line with its section and the paper's figure, beside the figure measured here
from the results files and a verdict.

A claim is a registered :class:`Claim` (``CLAIMS``; the COEC paper's in :mod:`.paper`, the
iterative method's in ``coec.iterative.claims``). Its ``check`` gets a
:class:`Results` (lazy readers of the files named by the spec the workflow builds,
``coec.workflow.targets.claims_spec``) and returns ``(ours, verdict)``; it raises :class:`NotTestable`
with a reason when the config lacks what it needs. The spec::

    {"ppl_tables": [csv, ...], "zeroshot_tables": [csv, ...],        # table1/2 + extra_tables
     "table3": csv | null, "table3_rows": [compensation, ...],        # config order
     "table4": csv | null, "appC": csv | null,
     "fig2": {panel: {comp: [[N, ppl.json], ...]}} | null,
     ... and the iterative method's entries (``coec.iterative.targets.claims_spec``)}
"""
