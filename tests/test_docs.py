"""The map stays true: every path docs/architecture.md names exists, every module is on its map, the layers
import only downwards, no module imports one that imports it back, and no two modules share a name. The
docs stay true too: the README reads in five minutes, and every link and every repository path that
README.md and docs/*.md name exists."""

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
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
"""The README a new user reads in five minutes; the rest lives in docs/, by topic."""
REPO_PATH = re.compile(r"(?<![\w./$~-])((?:zerotune|tests|bench|docs|examples)/[\w./*-]*)")
"""A repository path as the docs write it: from a top-level folder, not the tail of another path or a URL."""
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


def _split_code(text: str) -> tuple[list[str], str]:
    """The fenced code blocks of a Markdown text and the text without them."""
    fence = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
    return fence.findall(text), fence.sub("", text)


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown text's headings: lower case, punctuation dropped, spaces to hyphens, and a
    repeated heading numbered (``-1``, ``-2``)."""
    seen: collections.Counter[str] = collections.Counter()
    anchors = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", _split_code(text)[1], re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def _named_paths(text: str) -> set[str]:
    """Every repository path in a Markdown text's code: fenced blocks and backticked spans."""
    blocks, prose = _split_code(text)
    spans = blocks + re.findall(r"`([^`\n]+)`", prose)
    return {m.rstrip(".,") for span in spans for m in REPO_PATH.findall(span)}


def _exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    if (ROOT / path).exists():
        return True
    # `zerotune/tuner/choice.choose`: a name in a module
    module = re.sub(r"\.\w+$", ".py", path)
    return module != path and (ROOT / module).is_file()


def test_the_readme_reads_in_five_minutes() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, \
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail to docs/"


def test_every_relative_link_in_the_docs_resolves() -> None:
    assert len(DOCS) > 5, DOCS
    broken = []
    for doc in DOCS:
        prose = _split_code(doc.read_text())[1]
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)} -> {target}"
            if not file.exists() or not file.is_relative_to(ROOT):
                broken.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, broken


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = []
    named = 0
    for doc in DOCS:
        paths = _named_paths(doc.read_text())
        named += len(paths)
        missing += [f"{doc.relative_to(ROOT)}: {p}" for p in sorted(paths) if not _exists(p)]
    assert named > 100, named
    assert not missing, missing


def test_the_doc_checks_see_what_they_check() -> None:
    """The helpers above find what a doc writes: a path in a code block, a backticked one, not a URL's tail."""
    text = "# A title's words\n\n```bash\npython bench/x.py   # bench/y.py\n```\n`zerotune/a.py`, " \
           "`sqlite:///$HOME/zerotune/db` and ~/.cache/zerotune/z, [t](docs/a.md#a-titles-words)\n## A title's words\n"
    assert _named_paths(text) == {"bench/x.py", "bench/y.py", "zerotune/a.py"}
    assert _anchors(text) == {"a-titles-words", "a-titles-words-1"}
    assert _exists("zerotune/tuner/choice.choose") and _exists("bench/published/*.toml")
    assert not _exists("zerotune/tuner/nothing.py") and not _exists("bench/published/*.nothing")


def _import_graph() -> dict[str, set[str]]:
    """Every module of the package (packages by their ``__init__``) and the modules of the package it imports, at
    module level or inside a function: ``import zerotune.a.b`` counts ``zerotune.a.b``; ``from zerotune.a import b``
    counts ``zerotune.a.b`` where ``b`` is a module, else ``zerotune.a``."""
    paths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" not in path.parts:
            parts = path.relative_to(ROOT).with_suffix("").parts
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, one level up per dot beyond the first
                    above = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(above + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in paths:  # zerotune.a.b.function -> zerotune.a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    out.add(target)
        graph[name] = out
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules along it, first repeated at the end; None where there is none."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done (no cycle through it)
    for root in sorted(graph):
        if root in state:
            continue
        path, todo = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(graph[nxt])))
    return None


def test_no_module_imports_one_that_imports_it_back():
    """No cycle in the package's imports, through any number of modules, imports inside functions included: a
    module that needs another which needs it back works only in one import order (the cost model once predicted
    at first use to build its presets: ``catalog`` -> ``profiles`` -> ``predict`` -> ``error`` -> ``profiles``)."""
    graph = _import_graph()
    assert {"zerotune.costmodel.profiles", "zerotune.api.prologue.body"} <= set(graph)
    assert "zerotune.costmodel.predict" in graph["zerotune.costmodel"]  # the walk sees the imports it must
    assert "zerotune.costmodel.coordinator" in graph["zerotune.costmodel"]  # (one inside a function)
    cycle = _cycle(graph)
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])
    found = _cycle({**graph, "zerotune.core.spec": graph["zerotune.core.spec"] | {"zerotune.core.plan"}})
    assert found in (["zerotune.core.plan", "zerotune.core.spec", "zerotune.core.plan"],
                     ["zerotune.core.spec", "zerotune.core.plan", "zerotune.core.spec"])  # one it would find
