"""docs/design.md stays true to the code (issue 26): its layout names every module of the package,
under its folder, and the package's import graph has no cycle."""

import ast
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fairseq_deep"


def layout_block(text: str) -> str:
    section = text[text.index("## Layout") :]
    return section[section.index("```") + 3 : section.index("```", section.index("```") + 3)]


def named_modules(block: str) -> set:
    """Paths (relative to the repository) that the layout names: a line's names are what comes
    before its description (two spaces or more); ``folder/`` opens a folder for the lines indented
    under it; every ``name.py`` among the names is a module of the innermost open folder."""
    named, folders = set(), []  # folders: (indent, name)
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        names = re.split(r"\s{2,}", line.strip())[0]
        if names.endswith("/") or re.search(r"\w+\.py\b", names):
            while folders and folders[-1][0] >= indent:
                folders.pop()
        prefix = "/".join(name for _, name in folders)
        if names.endswith("/"):
            folders.append((indent, names.rstrip("/")))
            continue
        for module in re.findall(r"\b(\w+\.py)\b", names):
            named.add(f"{prefix}/{module}" if prefix else module)
    return named


def package_modules() -> set:
    """Every module of the package; a subpackage's ``__init__.py`` is named by its folder."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" and path.parent != PACKAGE:
            rel = path.parent.relative_to(ROOT).as_posix() + "/"
        found.add(rel)
    return found


def test_the_layout_names_every_module():
    block = layout_block((ROOT / "docs" / "design.md").read_text())
    named = named_modules(block)
    folders = {
        line.split()[0]
        for line in block.splitlines()
        if line.strip() and line.split()[0].endswith("/")
    }
    missing = []
    for module in sorted(package_modules()):
        if module.endswith("/"):
            if module.split("/")[-2] + "/" not in folders:
                missing.append(module)
        elif module not in named:
            missing.append(module)
    assert not missing, f"docs/design.md's layout does not name {missing}: add a line for each"
    stale = sorted(m for m in named if not (ROOT / m).is_file())
    assert not stale, f"docs/design.md's layout names modules that do not exist: {stale}"


def test_the_layout_reader_sees_a_missing_module():
    """The check itself: a layout without one module's line misses exactly that module."""
    block = layout_block((ROOT / "docs" / "design.md").read_text())
    without = "\n".join(
        line for line in block.splitlines() if not line.strip().startswith("triton_common.py")
    )
    assert named_modules(block) - named_modules(without) == {
        "fairseq_deep/modules/recurrent/triton_common.py"
    }


def test_no_import_cycle():
    """No two modules import each other, directly or through others (imports inside functions
    count: they only defer the circle; so does an import of the package's root, which imports the
    registering submodules and the patches)."""
    graph = package_graph()

    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return trail + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, sorted(graph)) if c]
    assert not cycles, f"import cycle: {' -> '.join(cycles[0])}"


def test_every_preset_goes_through_register_preset():
    """design.md, "Presets": no module but models/presets.py calls fairseq's
    register_model_architecture (a preset registered by hand escapes fix_option/fix_depth)."""
    callers = [
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path != PACKAGE / "models" / "presets.py"
        and "register_model_architecture(" in path.read_text()
    ]
    assert not callers, f"register_model_architecture called outside models/presets.py: {callers}"


def test_every_checkpoint_is_loaded_by_the_loader():
    """design.md, "Conventions": no module but checkpoints.py reads a checkpoint itself (torch.load,
    fairseq's load_checkpoint_to_cpu), so every tool says a bad file in the same one line."""
    readers = [
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path != PACKAGE / "checkpoints.py"
        and re.search(r"torch\.load\(|\bload_checkpoint_to_cpu\(", path.read_text())
    ]
    assert not readers, f"checkpoints read outside fairseq_deep/checkpoints.py: {readers}"


# ---- "Options: one home each": readers take their options from the dataclass ----------------------

SIZES = (
    "encoder_embed_dim",
    "decoder_embed_dim",
    "encoder_hidden_size",
    "decoder_hidden_size",
    "dropout",
)


def _built_twice(arch, build):
    """``build(args)`` from the preset's full namespace and from one holding only the sizes (an
    older checkpoint's): the same module, when every other option takes its dataclass default."""
    from argparse import Namespace

    from helpers import parse_model_args

    full = parse_model_args(arch)
    sparse = Namespace(**{name: getattr(full, name) for name in SIZES})
    modules = []
    for args in (full, sparse):
        torch.manual_seed(0)
        modules.append(build(args))
    return modules


def _same(a, b):
    assert a.state_dict().keys() == b.state_dict().keys()
    for name, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[name]), name


def test_rnmt_plus_reads_its_options_from_its_dataclass():
    from helpers import tiny_dictionary

    from fairseq_deep.models.rnmt_plus import RNMTPlusDecoder, RNMTPlusEncoder

    d = tiny_dictionary()

    def build(args):
        enc = RNMTPlusEncoder(
            args, d, torch.nn.Embedding(len(d), 16, padding_idx=d.pad()), output_dim=32
        )
        return torch.nn.ModuleList(
            [
                enc,
                RNMTPlusDecoder(
                    args,
                    d,
                    torch.nn.Embedding(len(d), 16, padding_idx=d.pad()),
                    encoder_output_dim=32,
                ),
            ]
        )

    _same(*_built_twice("rnmt_plus", build))


def test_deep_att_reads_its_options_from_its_dataclass():
    from helpers import tiny_dictionary

    from fairseq_deep.models.deep_att.decoder import DeepAttDecoder
    from fairseq_deep.models.deep_att.encoder import DeepAttEncoder

    d = tiny_dictionary()

    def build(args):
        enc = DeepAttEncoder(args, d, torch.nn.Embedding(len(d), 16, padding_idx=d.pad()))
        dec = DeepAttDecoder(
            args, d, torch.nn.Embedding(len(d), 16, padding_idx=d.pad()), enc.output_dim
        )
        return torch.nn.ModuleList([enc, dec])

    _same(*_built_twice("deep_att", build))


# ---- "Floors": no import runs back up -----------------------------------------------------------


def floor_table(text: str) -> dict:
    """design.md's Floors table as ``{module or folder (dotted): floor}``: each row's floor is the
    number it starts with, its modules the backticked names of its second column (``x.py``,
    ``x/y.py``, a folder ``x/``, ``__init__.py``: the package root)."""
    section = text[text.index("## Floors") :]
    section = section[: section.index("\n## ", 1)]
    floors = {}
    for row in re.findall(r"^\| (\d+) [^|]*\| ([^|]*)\|", section, re.M):
        for name in re.findall(r"`([\w/.]+)`", row[1]):
            dotted = name[: -len(".py")] if name.endswith(".py") else name.rstrip("/")
            dotted = "" if dotted == "__init__" else dotted.replace("/", ".")
            floors["fairseq_deep" + ("." + dotted if dotted else "")] = int(row[0])
    return floors


def package_graph(package: Path = PACKAGE) -> dict:
    """``{module: the modules of the package it imports}`` (dotted names; a package by its
    ``__init__``, the root ``fairseq_deep`` included), imports inside functions too: ``from P
    import name`` imports the module ``P.name`` where there is one, else ``P``."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    graph = {}
    for name, path in modules.items():
        package_of = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package_of.split(".")[: len(package_of.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def floor_problems(package: Path = PACKAGE, design: Path = ROOT / "docs" / "design.md") -> list:
    """What makes the drawing of ``design`` (its Floors table) untrue of ``package``: a module
    without a floor, a named module that does not exist, and every import of a module on a
    higher floor than the importer's."""
    floors = floor_table(design.read_text())
    graph = package_graph(package)

    def floor_of(module):
        if module == "fairseq_deep":  # the root's own entry, never a prefix of the others
            return floors.get(module)
        found = [p for p in floors if p != "fairseq_deep" and (module + ".").startswith(p + ".")]
        return floors[max(found, key=len)] if found else None

    problems = [
        f"{p} is named in the Floors table but does not exist" for p in floors if p not in graph
    ]
    problems += [f"{m} has no floor" for m in sorted(graph) if floor_of(m) is None]
    for name in sorted(graph):
        for imported in sorted(graph[name]):
            low, high = floor_of(name), floor_of(imported)
            if low is not None and high is not None and high > low:
                problems.append(f"{name} (floor {low}) imports {imported} (floor {high})")
    return problems


def floor_units(package: Path = PACKAGE, design: Path = ROOT / "docs" / "design.md"):
    """(the floors computed from the import graph, problems): each entry of design's Floors table
    (a folder, or a module directly under the package) is one unit, the modules of a folder
    sharing its floor (a sub-folder named on a row of its own, ``modules/histories/``, is a unit
    of its own).  A unit's floor is the length of its longest chain of imports of other units: 0
    where it imports none, else one more than the highest of those it imports; a problem is a
    row that names a module inside a folder (a folder standing on two floors), a cycle between
    units, and a unit drawn on another floor than its imports put it."""
    floors = floor_table(design.read_text())
    graph = package_graph(package)
    problems = []
    for entry in floors:
        path = package.parent / entry.replace(".", "/")
        if entry.count(".") > 1 and not path.is_dir():
            problems.append(f"{entry} is a module of a folder drawn apart from it")

    def unit(module):
        if module in floors:
            return module
        found = [p for p in floors if p != "fairseq_deep" and (module + ".").startswith(p + ".")]
        return max(found, key=len) if found else None

    uses = {}
    for name, imported in graph.items():
        if unit(name) is not None:
            uses.setdefault(unit(name), set()).update(
                unit(m) for m in imported if unit(m) not in (None, unit(name))
            )
    computed, chain = {}, {}

    def level(u, path=()):
        if u in path:
            problems.append("a cycle of units: " + " -> ".join((*path[path.index(u) :], u)))
            return 0
        if u not in computed:
            below = [(level(v, (*path, u)), v) for v in sorted(uses.get(u, ()))]
            top = max(below, default=(-1, None))
            computed[u], chain[u] = top[0] + 1, top[1]
        return computed[u]

    for u in sorted(uses):
        level(u)
    for u in sorted(computed):
        if computed[u] != floors[u]:
            down, v = [u], chain[u]
            while v is not None:
                down, v = down + [v], chain[v]
            problems.append(
                f"{u} is drawn on floor {floors[u]}, its imports put it on floor {computed[u]} "
                f"({' -> '.join(down)})"
            )
    return computed, problems


def test_the_floors_are_drawn_as_they_are():
    """design.md's Floors table assigns every module of the package a floor (the root too), and
    every import (at the top or inside a function, of the root too) goes to a module of the same
    floor or below."""
    problems = floor_problems()
    assert not problems, "docs/design.md's Floors do not hold:\n" + "\n".join(problems)


def test_each_folder_stands_on_the_floor_its_imports_give_it():
    """Each folder (and each module directly under the package) stands on one floor, the one
    its longest chain of imports gives it: a floor drawn higher or lower than the code has, a
    module drawn apart from its folder or a cycle between folders fails."""
    computed, problems = floor_units()
    assert not problems, "docs/design.md's Floors do not hold:\n" + "\n".join(problems)
    assert max(computed.values()) == 8  # the floors the code has: 0-8


def test_the_floor_check_sees_what_is_untrue(tmp_path):
    """The check itself, on a small package and its drawing: a model importing the command-line
    layer, a model importing the package's root (which stands above it), a module the table does
    not name and a name of the table that is no module are found, and nothing else (the
    command-line layer importing a model is fine); a floor drawn other than the imports give
    it and a module drawn apart from its folder are found by the floors' own check."""
    package = tmp_path / "fairseq_deep"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("from .models import family  # noqa: F401\n")
    (package / "models" / "__init__.py").write_text("")
    (package / "models" / "family.py").write_text("def f():\n    from ..cli import main\n")
    (package / "models" / "other.py").write_text("import fairseq_deep\n")
    (package / "cli.py").write_text("from .models import family\n\n\ndef main():\n    pass\n")
    (package / "orphan.py").write_text("")
    design = tmp_path / "design.md"
    design.write_text(
        "## Floors\n\n| floor | modules | what |\n| --- | --- | --- |\n"
        "| 4 scripts | `cli.py`, `gone.py` | x |\n| 3 root | `__init__.py` | x |\n"
        "| 2 models | `models/` | x |\n\n## Next\n"
    )
    assert floor_problems(package, design) == [
        "fairseq_deep.gone is named in the Floors table but does not exist",
        "fairseq_deep.orphan has no floor",
        "fairseq_deep.models.family (floor 2) imports fairseq_deep.cli (floor 4)",
        "fairseq_deep.models.other (floor 2) imports fairseq_deep (floor 3)",
    ]
    # the floors' own check: models and cli import each other; cli drawn too high
    (package / "models" / "family.py").write_text("X = 1\n")
    (package / "models" / "other.py").write_text("")
    (package / "orphan.py").unlink()
    design.write_text(
        "## Floors\n\n| floor | modules | what |\n| --- | --- | --- |\n"
        "| 4 scripts | `cli.py` | x |\n| 3 root | `__init__.py` | x |\n"
        "| 0 models | `models/` | x |\n| 0 a model | `models/other.py` | x |\n\n## Next\n"
    )
    computed, problems = floor_units(package, design)
    assert computed == {
        "fairseq_deep": 1,
        "fairseq_deep.cli": 1,
        "fairseq_deep.models": 0,
        "fairseq_deep.models.other": 0,
    }
    assert problems == [
        "fairseq_deep.models.other is a module of a folder drawn apart from it",
        "fairseq_deep is drawn on floor 3, its imports put it on floor 1 "
        "(fairseq_deep -> fairseq_deep.models)",
        "fairseq_deep.cli is drawn on floor 4, its imports put it on floor 1 "
        "(fairseq_deep.cli -> fairseq_deep.models)",
    ]
