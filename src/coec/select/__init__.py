"""Selection: column scores, keep sets, aligned widths and roundings."""
