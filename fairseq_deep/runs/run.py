"""A fairseq run as a value: :class:`Run` (a program, its data folder and its settings as named
:class:`Part` s), and the one place that writes it as a command line: :meth:`Run.argv` (``python
-m fairseq_cli.train DATA --user-dir <this package> ...``, what runs) and :meth:`Run.console` /
:meth:`Run.shell` (``fairseq-deep-train DATA ...``, what a document or a printed "next command"
shows).  Settings compose in order and a later value wins, as fairseq's parser keeps the last
value of a repeated option; :func:`flags` writes settings (``{"max_tokens": 4096}``) as options."""

import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from ..models.families import Spec

#: this package's folder: fairseq's --user-dir
PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = "fairseq_cli.train"
GENERATE = "fairseq_cli.generate"
INTERACTIVE = "fairseq_cli.interactive"
PREPROCESS = "fairseq_cli.preprocess"
#: what a run restored from another model's checkpoint needs: its optimizer state and schedule start
#: afresh (a grown model's have other shapes), and so does the data's epoch
RESET = ["--reset-optimizer", "--reset-lr-scheduler", "--reset-dataloader"]


@dataclass(frozen=True)
class Program:
    """A program a run starts: its Python ``module`` (run as ``python -m MODULE``; every one has a
    ``cli_main``), fairseq's ``console`` script, ``ours``: this package's console script of the
    same program (the plugin loaded, no ``--user-dir``), whether it takes the data folder as its
    first argument (``data``) and whether fairseq must load this package (``--user-dir``)."""

    module: str
    console: str
    ours: Optional[str] = None
    data: bool = False
    plugin: bool = False


PROGRAMS = {
    "train": Program(TRAIN, "fairseq-train", "fairseq-deep-train", True, True),
    "generate": Program(GENERATE, "fairseq-generate", "fairseq-deep-generate", True, True),
    "interactive": Program(
        INTERACTIVE, "fairseq-interactive", "fairseq-deep-interactive", True, True
    ),
    "preprocess": Program(PREPROCESS, "fairseq-preprocess"),
    "prepare": Program("fairseq_deep.prepare", "fairseq-deep-prepare"),
    "grow": Program("fairseq_deep.grow", "fairseq-deep-grow"),
    "export": Program("fairseq_deep.export", "fairseq-deep-export"),
    "distill": Program("fairseq_deep.distill", "fairseq-deep-distill", data=True),
}
#: the program of ``python -m fairseq_cli.X`` (:func:`command`'s ``module``)
_BY_MODULE = {p.module: name for name, p in PROGRAMS.items()}


def option(name: str) -> str:
    """``max_tokens`` as ``--max-tokens``."""
    return "--" + name.replace("_", "-")


def text(value) -> str:
    """A value as a command line writes it: a string as it is, anything else ``str(value)``."""
    return value if isinstance(value, str) else str(value)


def flags(settings: Mapping[str, object]) -> List[str]:
    """Settings (fairseq's option names, ``_`` or ``-``) as command-line options, in their order:
    ``True`` a bare flag, ``False`` and ``None`` nothing, a list or tuple its values after one
    option (``--ddp-backend``-style ``nargs``), a string as it is (a :class:`Variable` stays one),
    anything else ``str(value)`` (floats as ``f"{value:g}"``)."""
    argv: List[str] = []
    for name, value in settings.items():
        if value is None or value is False:
            continue
        if value is True:
            argv.append(option(name))
        elif isinstance(value, (list, tuple)):
            argv += [option(name), *map(str, value)]
        else:
            argv += [option(name), f"{value:g}" if isinstance(value, float) else text(value)]
    return argv


def has_option(argv: Sequence[str], name: str) -> bool:
    """Whether the words ``argv`` give option ``name`` (``--lr 1`` or ``--lr=1``): for words a
    person wrote (a study system's own flags); a :class:`Run` is asked by part (:meth:`Run.has`)."""
    return any(f == name or f.startswith(name + "=") for f in argv)


def option_value(argv: Sequence[str], name: str) -> Optional[str]:
    """The last value ``argv`` gives ``name`` (``--lr 1`` or ``--lr=1``: fairseq keeps the last),
    None where it gives none."""
    value = None
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


class Part(tuple):
    """Named settings of a run, as command-line words: ``Part("optimizer", ["--optimizer",
    "adam", ...])``.  A tuple of the words (so ``[*part]`` and ``cmd += part`` work, and it equals a
    list of the same words), with a ``name`` that says what it sets (``optimizer``, ``schedule``,
    ``criterion``, ``size``, ``device``, ``logging``, ``flags``, ...)."""

    name: str

    def __new__(cls, name: str, words: Iterable = ()):
        part = super().__new__(cls, (text(w) for w in words))
        part.name = name
        return part

    def __repr__(self):
        return f"Part({self.name!r}, {list(self)!r})"

    def __eq__(self, other):  # the same words, as a tuple or a list
        if isinstance(other, (list, tuple)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = tuple.__hash__


Piece = Union[Part, Sequence[str], Mapping[str, object], None]


def as_parts(pieces: Iterable[Piece]) -> Tuple[Part, ...]:
    """Each piece as a :class:`Part`: a Part as it is, settings (a mapping) through :func:`flags`
    as ``settings``, a list of words as ``flags``; None and empty pieces left out."""
    out = []
    for piece in pieces:
        if piece is None:
            continue
        if not isinstance(piece, Part):
            piece = (
                Part("settings", flags(piece))
                if isinstance(piece, Mapping)
                else Part("flags", piece)
            )
        if piece:
            out.append(piece)
    return tuple(out)


@dataclass(frozen=True)
class Run:
    """One run of a fairseq program (or of this package's: :data:`PROGRAMS`): ``program``, the data
    folder it reads (``data``, for train, generate and interactive) and its settings, ``parts`` in
    order (a later value wins: fairseq keeps the last value of a repeated option); ``arch``, the
    --arch of the model it trains, resolved once by its maker (a Spec: its family, preset and
    depths, :func:`fairseq_deep.models.families.spec`), where it has one."""

    program: str
    data: Optional[str] = None
    parts: Tuple[Part, ...] = ()
    arch: Optional["Spec"] = field(default=None, compare=False)

    def __post_init__(self):
        if self.program not in PROGRAMS:
            raise ValueError(f"Run: no program {self.program!r} (one of {', '.join(PROGRAMS)})")

    @classmethod
    def of(
        cls, program: str, data: Optional[str] = None, *pieces: Piece, arch: "Spec" = None
    ) -> "Run":
        """``Run.of("train", DATA, recipes.adam(...), ["--seed", "1"], {"max_tokens": 4096})``."""
        return cls(program, data, as_parts(pieces), arch)

    def plus(self, *pieces: Piece) -> "Run":
        """This run with more settings after its own (so they win)."""
        return replace(self, parts=self.parts + as_parts(pieces))

    def __add__(self, words: Piece) -> "Run":
        return self.plus(words)

    def without(self, name: str) -> "Run":
        """This run without its parts named ``name``."""
        return replace(self, parts=tuple(p for p in self.parts if p.name != name))

    @property
    def args(self) -> List[str]:
        """The settings as command-line words, the parts in order."""
        return [word for part in self.parts for word in part]

    def part(self, name: str) -> Optional[Part]:
        """The last part named ``name``; None where there is none."""
        found = [p for p in self.parts if p.name == name]
        return found[-1] if found else None

    def has(self, name: str) -> bool:
        """Whether a part named ``name`` is among the settings (``run.has("optimizer")``: the run
        was given an optimiser; the names of :mod:`.recipes`), however it writes its options."""
        return any(p.name == name for p in self.parts)

    def value(self, option: str) -> Optional[str]:
        """The value the program reads for ``option`` (``--lr``), whatever part gives it: its last
        one (None: not given).  For the rare question about one option's value; what a run was
        given is asked by part (:meth:`has`, :meth:`part`)."""
        return option_value(self.args, option)

    @property
    def spec(self) -> Program:
        return PROGRAMS[self.program]

    def arguments(self, user_dir: bool = True) -> List[str]:
        """The program's arguments: the data folder, ``--user-dir`` this package (where the
        program is fairseq's and ``user_dir``), the settings."""
        spec = self.spec
        return [
            *([self.data] if self.data is not None else []),
            *(["--user-dir", PLUGIN_DIR] if spec.plugin and user_dir else []),
            *self.args,
        ]

    def argv(self, launcher: Optional[Sequence[str]] = None) -> List[str]:
        """The command that runs: ``python -m MODULE ARGUMENTS`` with this Python (``launcher``:
        other words in place of ``python -m MODULE``)."""
        start = list(launcher) if launcher is not None else [sys.executable, "-m", self.spec.module]
        return [*start, *self.arguments()]

    def console(self, ours: bool = True) -> List[str]:
        """The command as a person types it: this package's console script (``fairseq-deep-train
        DATA ...``, the plugin loaded by the script), or with ``ours=False`` fairseq's own
        (``fairseq-train DATA --user-dir <this package> ...``)."""
        spec = self.spec
        if ours and spec.ours:
            return [spec.ours, *self.arguments(user_dir=False)]
        return [spec.console, *self.arguments()]

    def shell(self, ours: bool = True, width: Optional[int] = None, indent: str = "    ") -> str:
        """:meth:`console` quoted for a shell: one line, or lines of at most ``width`` characters
        continued with `` \\`` (the later ones after ``indent``)."""
        return shell(self.console(ours), width, indent)


class Variable(str):
    """A value that the person sets before running a printed command (a budget, ...): a shell
    variable, written ``"$NAME"`` by :func:`shell` so that the shell expands it.  Only for commands
    printed for a person (:meth:`Run.shell`): a run that executes has every value."""

    def __new__(cls, name: str):
        word = super().__new__(cls, "$" + name)
        word.name = name
        return word


def shell(words: Sequence[str], width: Optional[int] = None, indent: str = "    ") -> str:
    """Words as a shell command (each quoted where it must be; a :class:`Variable` as ``"$NAME"``):
    one line, or lines of at most ``width`` characters continued with `` \\``, an option kept on
    the line of its value."""
    quoted = [f'"{w}"' if isinstance(w, Variable) else shlex.quote(str(w)) for w in words]
    if width is None:
        return " ".join(quoted)
    units = []  # an option and its value stay together
    for word in quoted:
        if (
            units
            and units[-1].startswith("-")
            and " " not in units[-1]
            and not word.startswith("-")
        ):
            units[-1] += " " + word
        else:
            units.append(word)
    lines, line = [], ""
    for unit in units:
        if line and len(line) + 1 + len(unit) + 2 > width:
            lines.append(line)
            line = indent + unit
        else:
            line = f"{line} {unit}" if line else unit
    return " \\\n".join(lines + [line])


def run_of(argv: Sequence[str]) -> Run:
    """The :class:`Run` of a command :func:`command` wrote (``python -m fairseq_cli.X DATA
    --user-dir ... ARGS``); ValueError for any other."""
    words = list(argv)
    if len(words) < 3 or words[1] != "-m" or words[2] not in _BY_MODULE:
        raise ValueError(f"not a command of a known program: {shell(words[:3])}")
    program = _BY_MODULE[words[2]]
    rest = words[3:]
    data = rest.pop(0) if PROGRAMS[program].data and rest else None
    if PROGRAMS[program].plugin and rest[:1] == ["--user-dir"]:
        rest = rest[2:]
    return Run.of(program, data, rest)


def command(module: str, data: str, *args: str, user_dir: bool = True) -> List[str]:
    """``python -m MODULE DATA [--user-dir this package] ARGS...``: a fairseq program (:data:`TRAIN`,
    :data:`GENERATE`) run with this Python, the plugin loaded (:meth:`Run.argv` of that run)."""
    if module not in _BY_MODULE:
        raise ValueError(f"command: no program runs as python -m {module}")
    run = Run.of(_BY_MODULE[module], data, list(args))
    return run.argv() if user_dir else [sys.executable, "-m", module, data, *args]


def restore_flags(checkpoint: str) -> Part:
    """Training that starts from ``checkpoint`` (another model's, e.g. a grown one) with a fresh
    optimizer, schedule and data (:data:`RESET`)."""
    return Part("restore", ["--restore-file", checkpoint, *RESET])


def grow(
    checkpoint: str,
    out: str,
    encoder_layers: int,
    method: str = "stack",
    keep_training_time: bool = True,
) -> Run:
    """fairseq-deep-grow: ``checkpoint`` grown to ``encoder_layers`` into ``out``."""
    return Run.of(
        "grow",
        None,
        Part(
            "grow",
            [
                "--checkpoint",
                checkpoint,
                "--out",
                out,
                "--encoder-layers",
                encoder_layers,
                "--method",
                method,
                *(["--keep-training-time"] if keep_training_time else []),
            ],
        ),
    )


def grow_command(*args, **kwargs) -> List[str]:
    """``python -m fairseq_deep.grow ...``: :func:`grow`'s command line."""
    return grow(*args, **kwargs).argv()


def preprocess(
    source: str,
    target: str,
    destdir: str,
    trainpref: Optional[str] = None,
    validpref: Optional[str] = None,
    testpref: Optional[str] = None,
    joined: bool = True,
    srcdict: Optional[str] = None,
    tgtdict: Optional[str] = None,
    workers: int = 1,
) -> Run:
    """fairseq-preprocess: the text ``PREF.SOURCE`` / ``PREF.TARGET`` of each split given
    binarized into ``destdir``, with one dictionary of both languages (``joined``, what
    ``--share-all-embeddings`` needs) or the dictionaries ``srcdict`` / ``tgtdict``."""
    words = ["--source-lang", source, "--target-lang", target]
    for split, prefix in (("train", trainpref), ("valid", validpref), ("test", testpref)):
        if prefix is not None:
            words += [f"--{split}pref", prefix]
    words += ["--destdir", destdir]
    if srcdict or tgtdict:
        words += [
            *(["--srcdict", srcdict] if srcdict else []),
            *(["--tgtdict", tgtdict] if tgtdict else []),
        ]
    elif joined:
        words.append("--joined-dictionary")
    words += ["--workers", workers]
    return Run.of("preprocess", None, Part("preprocess", words))
