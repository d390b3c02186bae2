"""The suite's own guard: every test can fail, and nothing is skipped outside the allow-list.

A test function must contain an `assert`, a `pytest.raises`/`pytest.fail`, or call a helper that does
(helpers are resolved by name across tests/, to a fixed point). `pytest.skip`, `importorskip`,
`mark.skip`/`skipif` and `xfail` may appear only where ALLOWED names the place and why.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# (path relative to tests/, enclosing function) -> why a skip is allowed there.
ALLOWED = {
    ("requires.py", "missing"): "the one place a missing dependency skips, on a developer machine only; "
                                "with CI=true it fails instead",
}
SKIPS = {"skip", "importorskip", "skipif", "xfail"}
FAILS = {"raises", "fail"}


def _sources():
    for path in sorted(TESTS.rglob("*.py")):
        if "fixtures" in path.relative_to(TESTS).parts:
            continue  # captured data and helper programs, not tests
        yield path.relative_to(TESTS).as_posix(), path.read_text()


def _called(node):
    """Names a function body calls: bare names and `module.name` attributes."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            if isinstance(sub.func, ast.Name):
                yield sub.func.id
            elif isinstance(sub.func, ast.Attribute):
                yield sub.func.attr


def _is_pytest_attr(node, names):
    return (isinstance(node, ast.Attribute) and node.attr in names
            and isinstance(node.value, (ast.Name, ast.Attribute))
            and ast.unparse(node.value) in ("pytest", "pytest.mark"))


def _checks_directly(func):
    for sub in ast.walk(func):
        if isinstance(sub, ast.Assert):
            return True
        if isinstance(sub, ast.Call) and _is_pytest_attr(sub.func, FAILS):
            return True
    return False


def problems(sources):
    """[(path, line, message)] for `sources`: an iterable of (path, text)."""
    trees = {path: ast.parse(text, filename=path) for path, text in sources}
    functions = [(path, f) for path, tree in trees.items() for f in ast.walk(tree)
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    checking = {f.name for _, f in functions if _checks_directly(f)}
    grown = True
    while grown:  # helpers that call helpers that assert
        before = len(checking)
        checking |= {f.name for _, f in functions if set(_called(f)) & checking}
        grown = len(checking) != before
    found = []
    for path, f in functions:
        if f.name.startswith("test_") and not _checks_directly(f) and not set(_called(f)) & checking:
            found.append((path, f.lineno, "test %s has no assert, no pytest.raises and calls no helper that "
                                          "checks: it cannot fail" % f.name))
    for path, tree in trees.items():
        parents = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(tree):
            if not _is_pytest_attr(node, SKIPS):
                continue
            owner = parents.get(node)
            while owner is not None and not isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                owner = parents.get(owner)
            where = (path, owner.name if owner is not None else "<module>")
            if where not in ALLOWED:
                found.append((path, node.lineno, "%s outside the allow-list (in %s): use tests/requires.py, "
                                                 "which fails in CI" % (ast.unparse(node), where[1])))
    return found


def test_no_vacuous_tests_and_no_skips_outside_the_allow_list():
    found = problems(_sources())
    assert found == [], "\n".join("tests/%s:%d: %s" % p for p in found)


def test_every_allow_list_entry_exists_and_has_a_reason():
    functions = {(path, f.name) for path, text in _sources() for f in ast.walk(ast.parse(text))
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for where, why in ALLOWED.items():
        assert where in functions, "allow-list names %s, which does not exist" % (where,)
        assert len(why.split()) >= 5, "allow-list entry %s needs a reason" % (where,)


def test_the_guard_catches_what_it_names():
    bad = '''
import pytest
pytest.importorskip("nixl_cu13")
pytestmark = pytest.mark.skipif(True, reason="x")

def helper(x):
    assert x

def test_vacuous():
    x = 1 + 1

def test_calls_helper():
    helper(1)

def test_raises():
    with pytest.raises(ValueError):
        int("x")

def test_silent(tmp_path):
    try:
        import nothing
    except ImportError:
        pytest.skip("no")
    assert nothing
'''
    found = problems([("test_bad.py", bad)])
    assert [(line, " ".join(message.split()[:2])) for _, line, message in found] == [
        (9, "test test_vacuous"),
        (3, "pytest.importorskip outside"),
        (4, "pytest.mark.skipif outside"),
        (23, "pytest.skip outside"),
    ], found
