"""The built-in compensation methods, one module each; importing this package registers them in
``coec.compensate.method.METHODS`` (in this order: the options page and the schema list them so)."""

# isort: off
from coec.compensate.methods import none, bias, lstsq, rcpu, coec, blend  # noqa: F401  (registration on import, in this order)
# isort: on
