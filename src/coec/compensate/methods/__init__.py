"""The built-in compensation methods, one module each; importing this package registers them in
``coec.compensate.method.METHODS`` (in this order: the options page and the schema list them so)."""

from . import bias, blend, coec, lstsq, none, rcpu  # noqa: F401  (registration on import)
