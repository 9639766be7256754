"""The map stays true: every path docs/architecture.md names exists, every module is on its map, the layers
import only downwards, and no two modules share a name."""

from __future__ import annotations

import ast
import collections
import re

from tests.support import ROOT

PACKAGE = ROOT / "zerotune"
PARTS = ("core", "costmodel", "trainer", "db", "tuner", "api")
# what each layer may import of zerotune (docs/architecture.md, "One package, six layers")
ALLOWED = {"core": {"core", "errors"},
           "costmodel": {"costmodel", "core", "errors"},
           "trainer": {"trainer", "costmodel", "core", "errors"},
           "db": {"db", "errors"},
           "tuner": {"tuner", "db", "trainer", "costmodel", "core", "errors"},
           "api": {"api", "tuner", "db", "trainer", "costmodel", "core", "errors"}}
RESOURCES = {"calibrations", "jobs", "recommendations", "studies", "trials"}
"""The service's resources: each has its queries (``db/repository/<name>.py``) and its routes
(``api/routes/<name>.py``), named alike on purpose, as the FastAPI template names them."""


def _modules() -> list:
    return sorted(p for part in PARTS for p in (PACKAGE / part).rglob("*.py")
                  if "migrations" not in p.parts and "__pycache__" not in p.parts)


def test_every_path_the_architecture_names_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = set(re.findall(r"`((?:zerotune|tests|bench|docs)/[\w/.]*)`", text))
    assert len(paths) > 30, sorted(paths)
    files = {p for p in paths if not re.search(r"/[\w]+\.(?!py$|md$|json$)\w+$", p)}  # not `module.function`
    missing = sorted(p for p in files if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
    # "module.function" references of the form `zerotune/tuner/choice.choose`
    for module, name in re.findall(r"`(zerotune/[\w/]+)\.(\w+)`", text):
        source = ROOT / f"{module}.py"
        if source.exists() and name not in ("py", "md", "json"):
            assert re.search(rf"^(?:def|class|async def) {name}\b|^{name}\b", source.read_text(), re.MULTILINE), \
                f"{module}.{name}"


def test_every_module_is_on_the_architecture_map() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    words = set(re.findall(r"[a-z_]+", text))
    skip = {"__init__", "__main__", "_common"}
    absent = sorted(str(p.relative_to(ROOT)) for p in _modules() if p.stem not in skip and p.stem not in words)
    assert not absent, f"modules missing from docs/architecture.md: {absent}"


def test_layers_import_only_downwards() -> None:
    wrong = []
    for path in _modules():
        part = path.relative_to(PACKAGE).parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.split(".")[0] in PARTS + ("strategies",):
                    wrong.append(f"{path.relative_to(ROOT)}: bare 'import {name}' (spell zerotune.{name})")
                elif name.startswith("zerotune.") and name.split(".")[1] not in ALLOWED[part]:
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, wrong


def test_no_two_modules_share_a_name() -> None:
    """One name, one module: a reader who sees ``memory`` or ``model`` knows which file it is. Packages count
    as modules; the service's resources are the one exception (their queries and their routes)."""
    names: dict[str, list[str]] = collections.defaultdict(list)
    for path in PACKAGE.rglob("*"):
        if "__pycache__" in path.parts or "migrations" in path.parts:
            continue
        if path.is_dir() and (path / "__init__.py").exists() and path != PACKAGE:
            names[path.name].append(str(path.relative_to(ROOT)))
        elif path.suffix == ".py" and path.stem not in ("__init__", "__main__"):
            names[path.stem].append(str(path.relative_to(ROOT)))
    shared = {n: ps for n, ps in names.items() if len(ps) > 1 and n not in RESOURCES}
    assert not shared, shared
    for name in RESOURCES:
        assert sorted(names[name]) == [f"zerotune/api/routes/{name}.py", f"zerotune/db/repository/{name}.py"], name
