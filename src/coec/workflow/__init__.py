"""What the Snakemake rules wire: the wiring object W, resources, the memory plan, target specs."""
