"""Evaluation: perplexity (ppl) and zero-shot accuracy through lm-eval (zeroshot)."""
