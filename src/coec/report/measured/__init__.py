"""The pruned model as a product: what an export is checked against after it is written
(``reload``), and the measured deployment cost beside Table 4 (``timing``, ``worker``,
``bounds``, ``measured``; docs/deploy.md)."""
