"""Reports: tables, figures, Table 4 cost, the frontier, the claims, measured speed."""
