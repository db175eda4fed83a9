"""Calibration: the Gram pass over the dense model (loaded or streamed)."""
