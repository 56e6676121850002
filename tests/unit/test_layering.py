"""Imports point one way: entry points depend on the API and on storage, never the reverse.

Layers, inner first: ``allotment.domain`` (pure), ``allotment.db``
(storage), ``allotment.api`` (HTTP); then the entry points (the ``cli``
package, ``service``, ``server``, ``wsgi``, ``direct``).  Every
``import`` statement is read from the source (including those inside
functions, which run later but tie the modules together all the same).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import allotment

PACKAGE = Path(allotment.__file__).parent
ENTRY_POINTS = {"allotment.cli", "allotment.service", "allotment.server", "allotment.wsgi",
                "allotment.direct", "allotment.config_audit"}
#: What each inner layer may not import.
FORBIDDEN = {
    "allotment.domain": ENTRY_POINTS | {"allotment.api", "allotment.db"},
    "allotment.db": ENTRY_POINTS | {"allotment.api"},
    "allotment.api": ENTRY_POINTS,
}


def imports_of(path: Path, module: str) -> set[str]:
    """The modules named by every import in ``path`` (``from a import b`` gives a and a.b)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def modules(layer: str):
    root = PACKAGE / layer.split(".", 1)[1]
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        yield path, ".".join(relative.parts).removesuffix(".__init__")


def violations(layer: str) -> list[str]:
    found = []
    for path, module in modules(layer):
        for name in sorted(imports_of(path, module)):
            if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[layer]):
                found.append(f"{module} imports {name}")
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_inner_layers_do_not_import_outer_ones(layer):
    assert violations(layer) == []


def test_the_check_sees_imports_inside_functions(tmp_path):
    """The check can fail: a lazy import of the command line is found."""
    source = tmp_path / "sample.py"
    source.write_text("def f():\n    from allotment import cli\n    import allotment.service\n")
    assert {"allotment.cli", "allotment.service"} <= imports_of(source, "allotment.db.sample")


def test_relative_imports_are_resolved(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("from .. import service\nfrom . import tables\n")
    assert {"allotment.service", "allotment.db.tables"} <= imports_of(source, "allotment.db.sample")
