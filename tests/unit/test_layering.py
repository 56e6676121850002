"""Imports point one way: entry points depend on the API and on storage, never the reverse.

Layers, inner first: ``allotment.domain`` (pure), ``allotment.db``
(storage), ``allotment.api`` (HTTP); then the entry points (the ``cli``
package, ``service``, ``server``, ``wsgi``, ``direct``).  Every
``import`` statement is read from the source (including those inside
functions, which run later but tie the modules together all the same).

Within and across layers, no two modules import each other, directly or
round a circle, and no module is imported by a name computed at run time
(``importlib.import_module``, ``__import__``): a reader, and "go to
definition", can follow every import.  A name that starts with an
underscore is its module's own: no other module imports it or reads it
(``module._name``); what another module needs gets a public name.
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


def import_statements(path: Path, module: str):
    """(module, names) for every import in ``path``: ``import a.b`` gives
    ("a.b", []), ``from .x import y`` the absolute name of ``.x`` and ["y"]."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        yield from import_statements_of(node, package)


def import_statements_of(node: ast.AST, package: str):
    """:func:`import_statements` of one node (nothing unless it is an import)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, []
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        yield base, [alias.name for alias in node.names]


def imports_of(path: Path, module: str) -> set[str]:
    """The modules named by every import in ``path`` (``from a import b`` gives a and a.b)."""
    found = set()
    for base, names in import_statements(path, module):
        found.add(base)
        found.update(f"{base}.{name}" for name in names)
    return found


def all_modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        found[".".join(relative.parts).removesuffix(".__init__")] = path
    return found


def dependencies(path: Path, module: str, known: set[str]) -> set[str]:
    """The modules among ``known`` that ``path`` imports: ``from a import b``
    depends on ``a.b`` when that is a module, else on ``a``."""
    found = set()
    for base, names in import_statements(path, module):
        if not names:
            found.add(base)
        found.update(f"{base}.{name}" if f"{base}.{name}" in known else base for name in names)
    return (found & known) - {module}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The sets of modules that import one another round a circle (the
    strongly connected components of more than one module), each sorted."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = lowest[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                lowest[module] = min(lowest[module], lowest[other])
            elif other in stack:
                lowest[module] = min(lowest[module], index[other])
        if lowest[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def package_graph() -> dict[str, set[str]]:
    found = all_modules()
    return {module: dependencies(path, module, set(found)) for module, path in found.items()}


#: Functions that import a module named by a value computed at run time.
STRING_IMPORTERS = {"import_module", "__import__"}


def string_imports(path: Path) -> list[str]:
    """Calls in ``path`` that import an ``allotment`` module by a string (or
    by a value that may be one: anything but a literal naming another package)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
        if name not in STRING_IMPORTERS:
            continue
        argument = node.args[0] if node.args else None
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str) \
                and not argument.value.startswith("allotment"):
            continue  # a third-party module named in full
        found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def private_uses(path: Path, module: str, known: set[str]) -> list[str]:
    """Where ``path`` takes a private name (``_name``, not ``__dunder__``)
    from another allotment module: ``from m import _name`` or ``m._name``
    with ``m`` bound by an import."""
    found = []
    bound: dict[str, str] = {}  # local name -> the module it names
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update({alias.asname or alias.name: alias.name for alias in node.names if alias.name in known})
        elif isinstance(node, ast.ImportFrom):
            base, names = next(import_statements_of(node, package))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif base in known and private(alias.name):
                    found.append(f"{module}:{node.lineno}: from {base} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name):
            owner = bound.get(node.value.id)
            if owner is not None and owner != module:
                found.append(f"{module}:{node.lineno}: {owner}.{node.attr}")
    return found


#: Private names still used across modules, to be given public ones
#: (none now; an entry must go once its module is clean).
PRIVATE_USES_PENDING: set[str] = set()


def modules(layer: str):
    for module, path in all_modules().items():
        if module == layer or module.startswith(layer + "."):
            yield path, module


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


def test_no_import_circles():
    assert import_circles(package_graph()) == []


def test_no_module_is_imported_by_a_string():
    assert [found for path in all_modules().values() for found in string_imports(path)] == []


def test_the_circle_check_can_fail(tmp_path):
    """A circle closed by an import inside a function, and one of three modules, are found."""
    (tmp_path / "a.py").write_text("from allotment.api import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from allotment.api.a import thing\n")
    (tmp_path / "c.py").write_text("import allotment.api.d\n")
    (tmp_path / "d.py").write_text("from allotment.api import e\n")
    (tmp_path / "e.py").write_text("from . import c\n")
    known = {f"allotment.api.{name}" for name in "abcde"}
    graph = {f"allotment.api.{name}": dependencies(tmp_path / f"{name}.py", f"allotment.api.{name}", known)
             for name in "abcde"}
    assert import_circles(graph) == [["allotment.api.a", "allotment.api.b"],
                                     ["allotment.api.c", "allotment.api.d", "allotment.api.e"]]
    del graph["allotment.api.b"]
    assert import_circles(graph) == [["allotment.api.c", "allotment.api.d", "allotment.api.e"]]


def test_importing_a_submodule_does_not_depend_on_its_package(tmp_path):
    """``from allotment.cli import common`` needs allotment.cli.common, not
    what the package's __init__ imports (it runs first, whatever imports what)."""
    source = tmp_path / "sample.py"
    source.write_text("from allotment.cli import common, main\n")
    assert dependencies(source, "allotment.cli.sample", {"allotment.cli", "allotment.cli.common"}) == {
        "allotment.cli", "allotment.cli.common"}
    source.write_text("from allotment.cli import common\n")
    assert dependencies(source, "allotment.cli.sample", {"allotment.cli", "allotment.cli.common"}) == {
        "allotment.cli.common"}


def test_the_string_import_check_can_fail(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("import importlib\n"
                      "def handler(name):\n"
                      "    importlib.import_module(f'allotment.api.{name}')\n"
                      "    __import__('allotment.db.tables')\n"
                      "    importlib.import_module(name)\n"
                      "    importlib.import_module('prometheus_client')\n")
    assert [found.split(": ", 1)[0] for found in string_imports(source)] == [
        "sample.py:3", "sample.py:4", "sample.py:5"]


def test_no_private_name_is_used_outside_its_module():
    known = set(all_modules())
    found = [use for module, path in all_modules().items() if module not in PRIVATE_USES_PENDING
             for use in private_uses(path, module, known)]
    assert found == []


@pytest.mark.parametrize("module", sorted(PRIVATE_USES_PENDING))
def test_pending_private_uses_are_still_there(module):
    """Once a module listed as pending is clean, its entry must go (so the check covers it again)."""
    known = set(all_modules())
    assert private_uses(all_modules()[module], module, known), f"{module} is clean: remove it from PRIVATE_USES_PENDING"


def test_the_private_name_check_can_fail(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("from allotment.api import allocations as api\n"
                      "from allotment.cli.common import _load, load\n"
                      "from allotment.db import tables\n"
                      "def f(self):\n"
                      "    return api._request, self._own, tables.__name__, tables.providers\n")
    known = {"allotment.api.allocations", "allotment.cli.common", "allotment.db.tables"}
    assert private_uses(source, "allotment.api.sample", known) == [
        "allotment.api.sample:2: from allotment.cli.common import _load",
        "allotment.api.sample:5: allotment.api.allocations._request"]
