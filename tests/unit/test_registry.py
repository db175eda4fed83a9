"""coec.registry.Registry's lazy entries: a built-in declared by name and module is listed in its
place without the import, imported on its first lookup, replaced in place by the entry its module
registers, refused as a second registration from elsewhere, and kept across ``restored()``."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from coec.registry import Registry, UnknownName
from registry_state import restored


@dataclass(frozen=True)
class Entry:
    name: str


REGISTRY: Registry[Entry] = Registry("toy entry")
MODULE = """
from test_registry import REGISTRY, Entry

REGISTRY.register(Entry("{name}"))
"""


@pytest.fixture()
def toys(tmp_path, monkeypatch):
    """A fresh registry with ``a`` (eager), lazy ``b`` (module toy_b) and ``c`` (module toy_c)."""
    for name in ("b", "c"):
        (tmp_path / f"toy_{name}.py").write_text(MODULE.format(name=name))
    (tmp_path / "toy_silent.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "test_registry", sys.modules[__name__])
    monkeypatch.setattr(REGISTRY, "_entries", {})
    monkeypatch.setattr(REGISTRY, "_origins", {})
    REGISTRY.register(Entry("a"))
    REGISTRY.register_lazy("b", "toy_b")
    REGISTRY.register_lazy("c", "toy_c")
    yield REGISTRY
    for name in ("toy_b", "toy_c", "toy_silent"):
        sys.modules.pop(name, None)


def test_lazy_entries_are_listed_without_their_module_and_imported_on_lookup(toys):
    assert toys.names() == ("a", "b", "c") and list(toys) == ["a", "b", "c"] and len(toys) == 3
    assert "b" in toys and "toy_b" not in sys.modules and toys.plugin_of("b") is None
    assert toys["b"] == Entry("b") and "toy_b" in sys.modules and "toy_c" not in sys.modules
    assert [e.name for e in toys.values()] == ["a", "b", "c"] and "toy_c" in sys.modules
    with pytest.raises(UnknownName, match=r"unknown toy entry 'd'.*\(available: a, b, c\)"):
        toys["d"]


def test_a_lazy_name_registered_from_elsewhere_is_refused(toys):
    with pytest.raises(ValueError, match=r"toy entry 'b' is registered twice \(toy_b and "):
        toys.register(Entry("b"))  # from this module, not toy_b
    with pytest.raises(ValueError, match=r"toy entry 'a' is registered twice"):
        toys.register_lazy("a", "toy_a")


def test_a_module_that_does_not_register_its_entry_is_named(toys):
    toys.register_lazy("s", "toy_silent")
    with pytest.raises(ImportError, match="toy_silent did not register the toy entry 's'"):
        toys["s"]


def test_restored_keeps_the_builtins_imported_inside_it(toys):
    with restored(toys):
        toys.register(Entry("extra"))
        assert toys["b"] == Entry("b")
    assert toys.names() == ("a", "b", "c")
    assert toys["b"] == Entry("b")  # its module is imported once: the entry stays registered
