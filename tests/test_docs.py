"""The map stays true: every path docs/architecture.md names exists, every module is on the README's layout,
and the layers import only downwards."""

from __future__ import annotations

import ast
import re

from tests.support import ROOT

PARTS = ("strategies", "tuner", "db", "api")
# what each part may import of zerotune (docs/architecture.md, "One package, four layers")
ALLOWED = {"strategies": {"strategies", "errors"}, "db": {"db", "errors"},
           "tuner": {"tuner", "db", "strategies", "errors"}, "api": {"api", "tuner", "db", "strategies", "errors"}}


def _modules() -> list:
    return sorted(p for part in PARTS for p in (ROOT / part).rglob("*.py")
                  if "migrations" not in p.parts and "__pycache__" not in p.parts)


def test_every_path_the_architecture_names_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = set(re.findall(r"`((?:strategies|tuner|db|api|tests|bench|zerotune)/[\w/.]*)`", text))
    assert len(paths) > 30, sorted(paths)
    files = {p for p in paths if not re.search(r"/[\w]+\.(?!py$|md$|json$)\w+$", p)}  # not `module.function`
    missing = sorted(p for p in files if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
    # "module.function" references of the form `tuner/choice.choose` or `api/service.normalize`
    for module, name in re.findall(r"`((?:strategies|tuner|db|api)/[\w/]+)\.(\w+)`", text):
        source = ROOT / f"{module}.py"
        if source.exists() and name not in ("py", "md", "json"):
            assert re.search(rf"^(?:def|class|async def) {name}\b|^{name}\b", source.read_text(), re.MULTILINE), \
                f"{module}.{name}"


def test_every_module_is_on_the_readmes_layout() -> None:
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.index("```", layout.index("```") + 3)]
    words = set(re.findall(r"[a-z_]+", layout))
    skip = {"__init__", "__main__", "_common"}
    absent = sorted(str(p.relative_to(ROOT)) for p in _modules() if p.stem not in skip and p.stem not in words)
    assert not absent, f"modules missing from the README's layout: {absent}"


def test_layers_import_only_downwards() -> None:
    wrong = []
    for path in _modules():
        part = path.relative_to(ROOT).parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.split(".")[0] in PARTS:
                    wrong.append(f"{path.relative_to(ROOT)}: bare 'import {name}' (spell zerotune.{name})")
                elif name.startswith("zerotune.") and name.split(".")[1] not in ALLOWED[part]:
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, wrong
