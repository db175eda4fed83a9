"""The compensation methods: :data:`METHODS`, every method by name. The built-in ones, one module
each, are declared here lazily, in this order (the options page and the schema list them so):
their names are known without importing them, and a lookup imports the method's module, which
registers its :class:`~coec.compensate.methods.base.Method` (no torch at import: the config
validation reads their options). A researcher's own method is a file named in the config's
``plugins`` (docs/adding-a-method.md)."""

from __future__ import annotations

from coec.compensate.methods.base import Method
from coec.registry import Registry

#: Every compensation method, by name (built-ins: the modules below; plug-ins: config ``plugins``).
METHODS: Registry[Method] = Registry("compensation method")

#: The built-in methods, each registered by ``coec.compensate.methods.<name>``.
BUILTIN = ("none", "bias", "lstsq", "rcpu", "coec", "blend")
for _name in BUILTIN:
    METHODS.register_lazy(_name, f"{__name__}.{_name}")
