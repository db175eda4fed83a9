"""Files between the stages: artifacts and their errors, atomic writes, safetensors, provenance, paths, progress."""
