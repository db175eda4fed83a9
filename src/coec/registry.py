"""Plug-in registries: one per kind of extension (compensation method, selection score, model
family, zero-shot task, export format), and the loading of a config's ``plugins``.

A registry maps a name to an entry (a dataclass describing the plug-in). An entry registers
when its module is imported. A built-in entry is also declared lazily (``register_lazy``: its
name and the module that defines it), so the registry lists it, in order, without importing the
module; its first lookup imports it. A researcher's own entry lives in one file of theirs that
registers itself on import, named in the config:

    plugins: [my_methods.py]            # a file (relative to the work folder) or a module name

    # my_methods.py
    from coec.compensate.method import METHODS, Method
    METHODS.register(Method(name="toy", options=ToyOptions, solve=solve_toy, doc="..."))

Every stage of the workflow (and the config validation) imports the same plugins, so the name
is known everywhere: in the schema's enums, in the rules' inputs, in the compensate stage.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import yaml


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


@dataclass(frozen=True)
class Lazy:
    """A built-in entry not imported yet: the module that registers it on import."""

    module: str


class Registry(Generic[E]):
    """Named entries of one plug-in kind, in registration order (lazy ones included)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, E | Lazy] = {}
        self._origins: dict[str, Origin] = {}

    def register(self, entry: E, name: str | None = None) -> E:
        """Add ``entry`` under ``name`` (default ``entry.name``); a second entry of the same name
        is refused, naming where each came from: a module, or the plug-in (file or module name)
        being loaded (re-registering the same definition, as a re-imported module does, is a
        no-op). The module a lazy entry names replaces it, in its place."""
        name = entry.name if name is None else name
        origin = registering_origin(sys._getframe(1).f_globals.get("__name__", ""))
        old = self._entries.get(name)
        if isinstance(old, Lazy):
            if origin.module != old.module or origin.loading is not None:
                raise ValueError(f"{self.kind} {name!r} is registered twice ({old.module} and {origin.where})")
        elif old is not None and old is not entry and not _same_definition(old, entry):
            first = self._origins.get(name, Origin(_module_of(old)))
            raise ValueError(f"{self.kind} {name!r} is registered twice ({first.where} and {origin.where})")
        self._entries[name] = entry
        self._origins.setdefault(name, origin)
        return entry

    def register_lazy(self, name: str, module: str) -> None:
        """Declare the built-in entry ``name`` that ``module`` registers on import: listed from
        now on, imported on its first lookup (``[name]``, ``items``, ``values``)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice ({self._origins[name].where} and {module})")
        self._entries[name] = Lazy(module)
        self._origins[name] = Origin(module)

    def _load(self, name: str) -> E:
        """The entry ``name``, its module imported first if it is lazy."""
        entry = self._entries[name]
        if isinstance(entry, Lazy):
            importlib.import_module(entry.module)
            entry = self._entries[name]
            if isinstance(entry, Lazy):
                raise ImportError(f"{entry.module} did not register the {self.kind} {name!r}")
        return entry

    def __getitem__(self, name: str) -> E:
        try:
            self._entries[name]
        except (KeyError, TypeError):
            raise UnknownName(self.unknown(name)) from None
        entry = self._load(name)
        plugin = self.plugin_of(name)
        if plugin is not None:
            USED_PLUGINS.add(plugin)
        return entry

    def plugin_of(self, name: str) -> str | None:
        """The plug-in (as the config names it) that registered ``name``; None for a built-in
        entry or an unknown name."""
        origin = self._origins.get(name)
        return origin.plugin if origin is not None else None

    def plugins(self) -> set[str]:
        """Every plug-in that registered an entry here."""
        return {o.plugin for o in self._origins.values() if o.plugin is not None}

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
        """Every entry, the lazy ones imported."""
        return [(name, self._load(name)) for name in list(self._entries)]

    def values(self) -> Iterable[E]:
        """Every entry, the lazy ones imported."""
        return [entry for _, entry in self.items()]

    def keys(self) -> Iterable[str]:
        return self._entries.keys()


@dataclass(frozen=True)
class Origin:
    """Where an entry was registered: the module that called ``register`` and the plug-in being
    imported then (None outside ``load_plugins``, or for the package's own modules)."""

    module: str
    loading: str | None = None

    @property
    def plugin(self) -> str | None:
        """The plug-in (as the config names it) the entry comes from; None for a built-in."""
        if self.loading is not None:
            return self.loading
        return next((spec for name, spec in _LOADED.items() if _within(self.module, name)), None)

    @property
    def where(self) -> str:
        """The plug-in, else the module (for messages)."""
        return self.plugin or self.module or "?"


#: The plug-ins whose entries this process looked up (``Registry.__getitem__``): the code a
#: stage's result depends on beyond the package (``coec.io.provenance.plugin_record``).
USED_PLUGINS: set[str] = set()

_LOADING: list[str] = []  # the plug-ins being imported now, innermost last


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def registering_origin(module: str) -> Origin:
    """The origin of an entry registered from ``module`` now: the plug-in being imported, unless
    ``module`` is the package's own (a built-in module the plug-in happened to import first)."""
    return Origin(module, _LOADING[-1] if _LOADING and not _within(module, "coec") else None)


def _module_of(entry: object) -> str:
    fn = getattr(entry, "solve", None) or getattr(entry, "columns", None) or entry
    return str(getattr(fn, "__module__", None) or type(entry).__module__)


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
            _LOADED.setdefault(name, spec)
            continue
        _LOADING.append(spec)
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
        finally:
            _LOADING.pop()
        _LOADED[name] = spec
    return names


def plugins_from_env() -> list[str]:
    """The plug-ins the workflow handed to this job (``COEC_PLUGINS``), loaded."""
    raw = os.environ.get(PLUGINS_ENV, "")
    specs = [s for s in raw.split(os.pathsep) if s]
    load_plugins(specs, PLUGINS_ENV)
    return specs


def plugin_sources(spec: str) -> list[Path]:
    """The source files of a plug-in: the file itself, or an importable module's file (every
    ``.py`` file under a package's folder), sorted. ValueError when they cannot be found."""
    if spec.endswith(".py"):
        return [Path(spec).resolve()]
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin or not Path(found.origin).is_file():
        raise ValueError(f"plug-in {spec!r}: no source file found")
    if found.submodule_search_locations:
        return sorted(p for d in found.submodule_search_locations for p in Path(d).rglob("*.py"))
    return [Path(found.origin)]


def plugin_sha256(spec: str) -> str:
    """sha256 of a plug-in's code: a single file's own sha256 (``sha256sum`` prints it), else
    that of the manifest ``<path relative to the package> <sha256>`` per line over a package's
    files."""
    files = plugin_sources(spec)
    digests = [(f, hashlib.sha256(f.read_bytes()).hexdigest()) for f in files]
    if len(digests) == 1:
        return digests[0][1]
    root = Path(os.path.commonpath([f.parent for f in files]))
    lines = "".join(f"{f.relative_to(root).as_posix()} {sha}\n" for f, sha in digests)
    return hashlib.sha256(lines.encode()).hexdigest()


def plugin_digests(specs: Iterable[str]) -> dict[str, str]:
    """``{plug-in: sha256 of its code}`` (``plugin_sha256``), sorted by plug-in."""
    return {spec: plugin_sha256(spec) for spec in sorted(set(specs))}


def add_plugin_options(parser: argparse.ArgumentParser) -> None:
    """``--plugins`` and ``--config`` of a command that prints a page generated from the
    registries, so that the page includes a researcher's plug-ins (``load_plugin_options``)."""
    parser.add_argument("--plugins", nargs="+", default=[], metavar="PLUGIN", help="plug-in files or module names")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="YAML",
        help="a config whose `plugins` to load (files relative to the current folder)",
    )


def load_plugin_options(args: argparse.Namespace) -> list[str]:
    """Load the plug-ins ``add_plugin_options`` parsed: ``--plugins``, then each ``--config``'s
    ``plugins``. ValueError (one line) for an unreadable config or a plug-in that fails."""
    loaded = load_plugins(args.plugins, "--plugins")
    for path in args.config:
        try:
            cfg = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"--config {path}: {type(exc).__name__}: {' '.join(str(exc).split())}") from None
        specs = cfg.get("plugins", []) if isinstance(cfg, dict) else []
        loaded += load_plugins(specs if isinstance(specs, list) else [], f"{path}: plugins")
    return loaded
