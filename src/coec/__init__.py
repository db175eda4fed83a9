"""coec: training-free structured pruning with calibrated orthogonal-equivalence compensation."""

__version__ = "0.1.0"
