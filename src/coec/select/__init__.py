"""Selection: column scores, keep sets, aligned widths and roundings."""

from coec.select import obs  # noqa: F401  (registers the obs selection in scores.SCORES on import)
