"""Plug-in registries: one per kind of extension (compensation method, selection score, model
family, zero-shot task, export format), and the loading of a config's ``plugins``.

A registry maps a name to an entry (a dataclass describing the plug-in). Built-in entries
register when their module is imported; a researcher's own entry lives in one file of theirs
that registers itself on import, named in the config:

    plugins: [my_methods.py]            # a file (relative to the work folder) or a module name

    # my_methods.py
    from coec.compensate.method import METHODS, Method
    METHODS.register(Method(name="toy", options=ToyOptions, solve=solve_toy, doc="..."))

Every stage of the workflow (and the config validation) imports the same plugins, so the name
is known everywhere: in the schema's enums, in the rules' inputs, in the compensate stage.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)

#: Environment variable through which the workflow hands its ``plugins`` to every job
#: (``os.pathsep``-separated, as in the config).
PLUGINS_ENV = "COEC_PLUGINS"


class UnknownName(KeyError, ValueError):
    """A name that no entry of a registry has (the message lists the available ones); a
    ``KeyError`` for dict-like lookups and a ``ValueError`` for bad input."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[E]):
    """Named entries of one plug-in kind, in registration order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, E] = {}

    def register(self, entry: E, name: str | None = None) -> E:
        """Add ``entry`` under ``name`` (default ``entry.name``); a second entry of the same name
        is refused (re-registering the same definition, as a re-imported module does, is a no-op)."""
        name = entry.name if name is None else name
        old = self._entries.get(name)
        if old is not None and old is not entry and not _same_definition(old, entry):
            raise ValueError(f"{self.kind} {name!r} is registered twice ({_origin(old)} and {_origin(entry)})")
        self._entries[name] = entry
        return entry

    def __getitem__(self, name: str) -> E:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownName(self.unknown(name)) from None

    def unknown(self, name: object) -> str:
        """``unknown <kind> 'x'; did you mean 'y'? (available: a, b)``."""
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r}{hint} (available: {', '.join(self._entries) or 'none'})"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> Iterable[tuple[str, E]]:
        return self._entries.items()

    @contextlib.contextmanager
    def restored(self) -> Iterator[Registry[E]]:
        """A block after which the registry holds exactly its entries of before (for tests that
        register plug-ins in-process)."""
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries = saved

    def values(self) -> Iterable[E]:
        return self._entries.values()

    def keys(self) -> Iterable[str]:
        return self._entries.keys()


def _origin(entry: object) -> str:
    fn = getattr(entry, "solve", None) or getattr(entry, "score", None) or entry
    mod = getattr(fn, "__module__", None) or type(entry).__module__
    return str(mod)


def _same_definition(old: object, new: object) -> bool:
    """The same entry defined again by a second import of its module (a plug-in file loaded
    under two module names): same type, same repr."""
    return type(old) is type(new) and repr(old) == repr(new)


_LOADED: dict[str, str] = {}


def plugin_module_name(spec: str) -> str:
    """The module name a plug-in spec is imported under: the module name itself, or for a
    ``.py`` file a name derived from its absolute path (so two files never collide)."""
    if not spec.endswith(".py"):
        return spec
    path = str(Path(spec).resolve())
    return f"coec_plugin_{Path(path).stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"


def load_plugins(specs: Iterable[str], where: str = "plugins") -> list[str]:
    """Import each plug-in (a ``.py`` file path or an importable module name) once; their
    import registers their entries. Returns the module names. A missing file or a failing
    import raises ``ValueError`` naming the plug-in and ``where`` it was configured."""
    names = []
    for i, spec in enumerate(specs):
        name = plugin_module_name(spec)
        names.append(name)
        if name in _LOADED or name in sys.modules:
            continue
        try:
            if spec.endswith(".py"):
                path = Path(spec).resolve()
                if not path.is_file():
                    raise FileNotFoundError(f"no such file: {path}")
                loader_spec = importlib.util.spec_from_file_location(name, path)
                if loader_spec is None or loader_spec.loader is None:
                    raise ImportError(f"cannot import {path}")
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[name] = module
                try:
                    loader_spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
            else:
                importlib.import_module(spec)
        except Exception as exc:  # noqa: BLE001 - any import failure is a config error here
            raise ValueError(
                f"{where}[{i}]: plug-in {spec!r} could not be loaded: {type(exc).__name__}: {exc}"
            ) from None
        _LOADED[name] = spec
    return names


def forget_plugins() -> None:
    """Forget which plug-ins were loaded (and drop the modules imported from files), so the next
    ``load_plugins`` imports them again (for tests)."""
    for name, spec in list(_LOADED.items()):
        if spec.endswith(".py"):
            sys.modules.pop(name, None)
        del _LOADED[name]


def plugins_from_env() -> list[str]:
    """The plug-ins the workflow handed to this job (``COEC_PLUGINS``), loaded."""
    raw = os.environ.get(PLUGINS_ENV, "")
    specs = [s for s in raw.split(os.pathsep) if s]
    load_plugins(specs, PLUGINS_ENV)
    return specs
