"""Text and evaluation data: text sources and windows, the wheel-shipped assets, zero-shot data."""
