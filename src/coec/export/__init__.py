"""Export: a pruned, compensated cell as a checkpoint folder (hf) or a GGUF file, and the importance matrix."""
