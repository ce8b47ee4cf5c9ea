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
        "fairseq_deep/modules/triton_common.py"
    }


def _imports(path: Path, module: str):
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def test_no_import_cycle():
    """No two modules import each other, directly or through others (imports inside functions
    count: they only defer the circle).  Importing the package root itself (``import
    fairseq_deep``, what a console script does to register the models) is not counted: the root
    only imports the registering submodules."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    graph = {
        name: {m for m in _imports(path, name) if m in modules and m not in (name, "fairseq_deep")}
        for name, path in modules.items()
    }

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

#: design.md, "Floors": each module's floor (the longest matching prefix); a module imports only
#: modules of its own floor or below.  The package root (it imports the registering submodules and
#: installs the patches) is not on a floor.
FLOORS = {
    "fairseq_deep.errors": 0,
    "fairseq_deep.quiet": 0,
    "fairseq_deep.data": 0,
    "fairseq_deep.modules": 1,
    "fairseq_deep.models": 2,
    "fairseq_deep.checkpoint_init": 2,
    "fairseq_deep.criterions": 2,
    "fairseq_deep.optim": 2,
    "fairseq_deep.tasks": 2,
    "fairseq_deep.diagnostics.grad_norm": 2,
    "fairseq_deep.patches.better_transformer": 2,
    "fairseq_deep.patches": 3,
    "fairseq_deep.model_options": 3,
    "fairseq_deep.progress": 3,
    "fairseq_deep.runs": 3,
    "fairseq_deep.prepare": 3,
    "fairseq_deep.serving": 3,
    "fairseq_deep.cli": 4,
    "fairseq_deep.grow": 5,
    "fairseq_deep.grow_report": 5,
    "fairseq_deep.export": 5,
    "fairseq_deep.score": 5,
    "fairseq_deep.own_data": 5,
    "fairseq_deep.quickstart": 5,
    "fairseq_deep.study": 5,
    "fairseq_deep.diagnostics": 5,
}


def floor_of(module: str) -> int:
    prefixes = [p for p in FLOORS if module == p or module.startswith(p + ".")]
    assert prefixes, f"{module} has no floor: add it to FLOORS here and to docs/design.md's Floors"
    return FLOORS[max(prefixes, key=len)]


def imports_running_up(package: Path = PACKAGE) -> list:
    """Every import of a package module (under ``package``, a ``fairseq_deep`` folder) of a module
    on a higher floor than the importer's."""
    up = []
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if name == "fairseq_deep":
            continue
        for imported in set(_imports(path, name)):
            where = package.parent / imported.replace(".", "/")
            if not imported.startswith("fairseq_deep.") or not (
                where.is_dir() or where.with_suffix(".py").is_file()
            ):
                continue  # fairseq, torch, ... or a name imported from a module
            if floor_of(imported) > floor_of(name):
                up.append(
                    f"{name} (floor {floor_of(name)}) imports {imported} (floor {floor_of(imported)})"
                )
    return sorted(up)


def test_no_import_runs_back_up():
    """Models and modules never import the command-line layer, the patches that scripts install,
    the runner or the tools; the tools may import everything below them."""
    up = imports_running_up()
    assert not up, "imports that run back up a floor:\n" + "\n".join(up)


def test_the_floor_check_sees_an_import_up(tmp_path):
    """The check itself: in a package where a model imports the command-line layer (and the
    command-line layer a model, which is fine), exactly the first import is found."""
    package = tmp_path / "fairseq_deep"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models" / "__init__.py").write_text("")
    (package / "models" / "family.py").write_text("from ..cli import main\n")
    (package / "cli.py").write_text("from .models import family\n\n\ndef main():\n    pass\n")
    assert imports_running_up(package) == [
        "fairseq_deep.models.family (floor 2) imports fairseq_deep.cli (floor 4)"
    ]
    assert floor_of("fairseq_deep.patches.better_transformer") < floor_of(
        "fairseq_deep.patches.scripts"
    )
