"""What fairseq, hydra and torch print on every run that a user of fairseq_deep cannot act on, and
the filters that keep it off a normal run, in one place; and the logging set-up of our console
scripts (:func:`script_logging`, fairseq's own format).

Two kinds, each filtered by its exact message (and category or logger), never wholesale:

- Python warnings (:data:`QUIET_WARNINGS`): deprecations inside fairseq and its pins;
  :func:`quiet_warnings` is called by every console script of ours (``PYTHONWARNINGS`` or ``-W``
  given by the user still apply first), already when the package is imported by one (a
  ``fairseq-deep-*`` program or ``python -m fairseq_deep...``: fairseq's import of fairscale,
  where it is installed, warns), and
  the hub interface filters torch's ``pin_memory`` warning on a machine without an accelerator
  (:func:`quiet_pin_memory`, from ``from_pretrained``: fairseq's batches ask for pinned memory).
- log records (:data:`QUIET_LOGS`): fairseq's import of its tasks logs "Please install
  tensorboardX" (``fairseq.tasks.text_to_speech``, a task these scripts never run) whenever
  tensorboardX is not installed, and ``--user-dir=<fairseq_deep> has already been imported`` on
  every run of a ``fairseq-deep-*`` script (they import the plugin before fairseq looks for it).
  The first is logged while fairseq is being imported, so :func:`quiet_logs` runs when
  ``fairseq_deep`` is imported, before it imports fairseq (its ``__init__`` imports this module
  first).  Logger filters only: ``--tensorboard-logdir`` without tensorboardX still warns
  (fairseq's progress bar says "tensorboard not found").
- fairseq's whole configuration (:data:`CONFIG_LOGS`): fairseq_cli's train, generate and
  interactive log it (``logger.info(cfg)``, about 10 kB: ``{'_name': None, 'common': {...``) as
  their second line.  Our console scripts (:func:`config_at_debug`, called by ``fairseq_deep.cli``
  only: plain ``fairseq-train --user-dir`` keeps it) log it at DEBUG level instead: ``LOGLEVEL=DEBUG
  fairseq-deep-train ...`` shows it (fairseq's own variable), and every checkpoint holds it
  (its ``cfg``).
"""

import logging
import os
import re
import sys
import warnings

PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))

#: torch's warning when fairseq's batch iterators ask for pinned memory and no accelerator exists
PIN_MEMORY = r"\s*'pin_memory' argument is set as true but no accelerator is found"

#: (category, message regex) of warnings that fairseq, hydra and torch print on every run and that
#: say nothing a user of these scripts can act on (deprecations inside fairseq and its pins).
QUIET_WARNINGS = [
    (UserWarning, r"\s*hydra\.experimental\.\w+\(\) is no longer experimental"),
    (UserWarning, r"\s*The version_base parameter is not specified"),
    (UserWarning, r"\s*In '\w+': Usage of deprecated keyword in package header"),
    (UserWarning, r"\s*'\w+' is validated against ConfigStore schema"),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated"),
    (FutureWarning, r"\s*`torch\.cuda\.amp\.\w+\(args\.\.\.\)` is deprecated"),
    (Warning, r"\s*`?torch\.jit\.(script|trace|_overload)\w*`? is deprecated"),
    (UserWarning, r"\s*Support for mismatched key_padding_mask and attn_mask is deprecated"),
    (UserWarning, PIN_MEMORY),
]

#: (logger name, message regex) of log records dropped (the logger's own filter: only records
#: logged by that logger, under the regex, matched from the start of the message)
QUIET_LOGS = [
    ("fairseq.tasks.text_to_speech", r"Please install tensorboardX: pip install tensorboardX$"),
    ("fairseq.utils", r"--user-dir=" + re.escape(PLUGIN_DIR) + r"/? has already been imported\.$"),
]

#: the loggers of fairseq_cli's scripts that log the whole configuration (``logger.info(cfg)``),
#: and that record's message (an omegaconf DictConfig printed as a dict)
CONFIG_LOGS = ("fairseq_cli.train", "fairseq_cli.generate", "fairseq_cli.interactive")
CONFIG_MESSAGE = r"\{'_name': None, 'common': \{"


def quiet_warnings():
    """Filter :data:`QUIET_WARNINGS` (``PYTHONWARNINGS`` or ``-W`` given by the user still apply first)."""
    for category, pattern in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category, append=True)


def script_logging(stream="stdout", level="INFO"):
    """The root logger as fairseq's own scripts set it up, writing to ``stream`` ("stdout": the
    ``sys.stdout`` of the call, not the one of the import; None: no handler), at ``level``
    (``LOGLEVEL`` wins; fairseq-deep-export, whose output is one line, its summary or its refusal,
    takes WARNING: no INFO lines of fairseq's task and model building before it), for every console
    script of ours.  fairseq_cli configures logging before it imports fairseq; here fairseq was
    imported first (with our package), and that import leaves a bare stderr handler at DEBUG level
    behind, which would turn fairseq's basicConfig into a no-op."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(os.environ.get("LOGLEVEL", level).upper())
    if stream == "stdout":
        stream = sys.stdout
    if stream is not None:
        logging.basicConfig(
            format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
            datefmt="%Y-%m-%d %H:%M:%S",
            level=root.level,
            stream=stream,
        )


def quiet_pin_memory():
    """Filter torch's warning that pinned memory is asked for where no accelerator exists (the hub
    interface in a user's own process: fairseq's batch iterators ask for it)."""
    warnings.filterwarnings("ignore", message=PIN_MEMORY, category=UserWarning, append=True)


def _run_by_our_script() -> bool:
    """A ``fairseq-deep-*`` console script, or ``python -m fairseq_deep.<module>`` (Python >= 3.10
    says so while the package is imported: ``sys.orig_argv``)."""
    if os.path.basename((getattr(sys, "argv", None) or [""])[0]).startswith("fairseq-deep-"):
        return True
    argv = list(getattr(sys, "orig_argv", None) or [])
    return any(a == "-m" and b.split(".")[0] == "fairseq_deep" for a, b in zip(argv, argv[1:]))


class DropMessages(logging.Filter):
    """Drops the records whose message matches one of ``patterns``."""

    def __init__(self, patterns):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to judge
            return True
        return not any(p.match(text) for p in self.patterns)


class ConfigAtDebug(logging.Filter):
    """fairseq's configuration record (:data:`CONFIG_MESSAGE`) turned into a DEBUG record: kept
    where its logger is enabled for DEBUG (``LOGLEVEL=DEBUG``), dropped otherwise."""

    pattern = re.compile(CONFIG_MESSAGE)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or isinstance(record.msg, str):
            return True  # the configuration is logged as the object itself
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to judge
            return True
        if not self.pattern.match(text):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def config_at_debug():
    """Install :class:`ConfigAtDebug` on the loggers of :data:`CONFIG_LOGS` (once; console scripts
    only)."""
    for name in CONFIG_LOGS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ConfigAtDebug) for f in logger.filters):
            logger.addFilter(ConfigAtDebug())


def quiet_logs():
    """Install the filters of :data:`QUIET_LOGS` on their loggers (once)."""
    by_logger = {}
    for name, pattern in QUIET_LOGS:
        by_logger.setdefault(name, []).append(pattern)
    for name, patterns in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) for f in logger.filters):
            logger.addFilter(DropMessages(patterns))


quiet_logs()
if _run_by_our_script():  # before fairseq is imported: its import warns too
    quiet_warnings()
