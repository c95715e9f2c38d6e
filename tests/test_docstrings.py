"""The public API says what it is for: every public module-level function and class in launcher/ has a
docstring, and so does every public method (properties included) of a public class. Public: the name does not
start with ``_``. Functions nested in functions and the methods of private classes are not checked. Read from
the source with ast, so nothing is imported (torch stays out of this test).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "launcher"

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _top_level_defs(tree: ast.Module):
    """Module-level defs, those under a module-level ``if`` / ``try`` (TYPE_CHECKING, import fallbacks) included."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, _DEFS):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", []) + [
                stmt for h in getattr(node, "handlers", []) for stmt in h.body]


def undocumented(source: str, *, methods: bool) -> list[tuple[int, str]]:
    """(line, name) of each public def in ``source`` without a docstring: module-level functions and classes, and
    with ``methods`` the public methods of public classes (as Class.method)."""
    out = []
    for node in _top_level_defs(ast.parse(source)):
        if node.name.startswith("_"):
            continue
        if ast.get_docstring(node) is None:
            out.append((node.lineno, node.name))
        if methods and isinstance(node, ast.ClassDef):
            out += [(m.lineno, f"{node.name}.{m.name}") for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("_")
                    and ast.get_docstring(m) is None]
    return sorted(out)


def test_public_functions_classes_and_methods_have_docstrings():
    missing = [f"{p.relative_to(PACKAGE.parent)}:{line} {name}"
               for p in sorted(PACKAGE.rglob("*.py")) for line, name in undocumented(p.read_text(), methods=True)]
    assert not missing, "public functions, classes or methods without a docstring (say what each is for):\n" + \
        "\n".join(missing)


def test_the_walk_finds_what_lacks_a_docstring():
    source = '''
import typing
def f(): pass
def _private(): pass
def g():
    """Documented."""
if typing.TYPE_CHECKING:
    def h(): pass
class C:
    """Documented."""
    def m(self): pass
    @property
    def p(self): return 1
    def _q(self): pass
    def n(self):
        """Documented."""
class _Hidden:
    def m(self): pass
class D:
    x: int
'''
    assert undocumented(source, methods=False) == [(3, "f"), (8, "h"), (19, "D")]
    assert undocumented(source, methods=True) == [(3, "f"), (8, "h"), (11, "C.m"), (13, "C.p"), (19, "D")]
