"""How fairseq is run, in one place: a run as a value (:class:`Run`: the program, its data and its
settings composed from named :mod:`recipes`), written as a command line in one place
(:meth:`Run.argv`, :meth:`Run.console`), executed in one place (:func:`execute`,
:func:`execute_together`: a :class:`Result` with the exit status, wall time, log, records,
translations and error), and what fairseq prints read back: training logs (:func:`parse_log`,
:func:`series`), fairseq-generate's output (:func:`parse_generate`), sacreBLEU (:func:`score`).

* :mod:`.run`: :class:`Run`, :class:`Part`, :data:`PROGRAMS`, :func:`flags`, :func:`preprocess`,
  :func:`grow`, :func:`restore_flags`, :class:`Variable` (a value a printed command leaves to its
  reader), :func:`command` (``python -m fairseq_cli.X ...``);
* :mod:`.recipes`: the named settings, each a part of a fixed name (optimisers and schedules, a
  family's paper recipe, a fixed learning rate, criterion, budget, saving, decoding, seed, sizes,
  device and precision, logging); :mod:`.sizes`: a family's size rule (:func:`model_kind`,
  :func:`width_flags`);
* :mod:`.executor`: :func:`execute`, :func:`execute_together`, :class:`Result`, :class:`Processes`;
* :mod:`.logs`: fairseq-train's json records and text facts, :func:`last_error`;
* :mod:`.translations`: fairseq-generate's output, sacreBLEU.
"""

from . import recipes  # noqa: F401
from .executor import (  # noqa: F401
    MARK,
    Processes,
    Result,
    RunFailed,
    execute,
    execute_together,
    together_command,
)
from .logs import (  # noqa: F401
    Record,
    Series,
    count_overflows,
    epochs_done,
    last_error,
    last_update,
    parse_loaded_update,
    parse_log,
    parse_log_lines,
    parse_params,
    parse_record,
    series,
    stop_reason,
    timed_records,
    updates_done,
)
from .run import (  # noqa: F401
    GENERATE,
    INTERACTIVE,
    PLUGIN_DIR,
    PREPROCESS,
    PROGRAMS,
    RESET,
    TRAIN,
    Part,
    Program,
    Run,
    Variable,
    command,
    flags,
    grow,
    grow_command,
    has_option,
    option,
    option_value,
    preprocess,
    restore_flags,
    run_of,
    shell,
)
from .sizes import model_kind, width_flags  # noqa: F401
from .translations import (  # noqa: F401
    Generated,
    Translated,
    count_test_sentences,
    hypotheses_by_id,
    paired_bootstrap,
    parse_generate,
    parse_translated,
    read_generate,
    score,
)
