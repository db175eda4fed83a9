"""Registry state for the tests that load plug-ins in-process: a block after which a registry
holds exactly its entries of before, and forgetting which plug-ins were loaded."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from coec import registry


@contextlib.contextmanager
def restored(reg: registry.Registry[Any]) -> Iterator[registry.Registry[Any]]:
    """A block after which ``reg`` holds exactly its entries of before; a lazy entry imported in
    the block stays imported (its module, imported once, would not register it again)."""
    saved, origins = dict(reg._entries), dict(reg._origins)
    try:
        yield reg
    finally:
        loaded = {
            n: e
            for n, e in reg._entries.items()
            if isinstance(saved.get(n), registry.Lazy) and not isinstance(e, registry.Lazy)
        }
        reg._entries, reg._origins = {**saved, **loaded}, origins


def forget_plugins() -> None:
    """Forget which plug-ins were loaded (and drop the modules imported from files), so the next
    ``load_plugins`` imports them again."""
    for name, spec in list(registry._LOADED.items()):
        if spec.endswith(".py"):
            sys.modules.pop(name, None)
        del registry._LOADED[name]
    registry.USED_PLUGINS.clear()
