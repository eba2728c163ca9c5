"""The import rules of DESIGN.md / STYLE.md 2.2, checked on the source with ast."""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _sources(folder: str) -> list[pathlib.Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_sources_exist():
    assert len(_sources("actorpy")) > 10


def test_core_imports_no_engine_or_app():
    bad = [(p.name, m) for p in _sources("actorpy") for m in _imports(p)
           if m.split(".")[0] in ("engines", "apps")]
    assert bad == []


def test_engines_do_not_import_each_other_or_apps():
    bad = []
    for engine in ("mapre", "param", "peer"):
        for p in _sources(f"engines/{engine}"):
            for m in _imports(p):
                parts = m.split(".")
                if parts[0] == "apps" or (parts[0] == "engines" and len(parts) > 1
                                          and parts[1] != engine):
                    bad.append((str(p.relative_to(ROOT)), m))
    assert bad == []


def test_barrier_is_pure():
    allowed_actorpy = {"actorpy.ids", "actorpy.clock", "actorpy.errors"}
    bad = []
    for p in _sources("actorpy/barrier"):
        for m in _imports(p):
            top = m.split(".")[0]
            if top in ("zmq", "socket", "time", "asyncio", "threading", "engines", "apps"):
                bad.append((p.name, m))
            elif top == "actorpy" and not (m.startswith("actorpy.barrier") or m in allowed_actorpy):
                bad.append((p.name, m))
    assert bad == []


def test_wire_does_not_import_runtime():
    bad = [(p.name, m) for p in _sources("actorpy/wire") for m in _imports(p)
           if m.startswith("actorpy.runtime")]
    assert bad == []


def test_only_serde_unpickles():
    pattern = re.compile(r"\b(pickle|cloudpickle)\.loads?\(")
    offenders = [str(p.relative_to(ROOT)) for folder in ("actorpy", "engines", "apps")
                 for p in _sources(folder) if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == ["actorpy/wire/serde.py"]


def test_tests_never_sleep():
    pattern = re.compile(r"\b(time\.)?sleep\(")
    offenders = [str(p.relative_to(ROOT)) for p in _sources("tests")
                 if p.name != "test_layering.py" and pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_core_and_mapre_load_without_numpy():
    # a driver whose imports loaded numpy (its BLAS threads) gets its embedded cluster
    # spawned, not forked: 0.5 s instead of 0.05 s to start, and the workers do not share its
    # sys.argv; actorpy.values imports numpy, so neither may import it at load
    # (`actorpy demo` started its cluster in 0.56 s, where 0.05 s is what a newcomer reads)
    code = "import sys, actorpy, actorpy.demo, engines.mapre; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
