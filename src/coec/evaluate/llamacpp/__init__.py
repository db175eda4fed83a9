"""Evaluation in a real llama.cpp: per-token logits, perplexity of a GGUF file, the AMX guard."""
