"""Selection: column scores, keep sets, aligned widths and roundings, the compensation-aware OBS
greedy, and the per-layer width search."""
