"""Sequence-level distillation (Kim and Rush 2016): ``fairseq-deep-distill`` (docs/distill.md).

    fairseq-deep-distill DATA-BIN --path TEACHER.pt --destdir OUT [fairseq-generate's options]
        [--shard-id I --num-shards N] [--keep-original] [--chunk-batches K]

(also ``python -m fairseq_deep.distill``).  The teacher (any checkpoint the package loads, any
family: :mod:`fairseq_deep.teacher`) translates the training split of DATA-BIN with fairseq's
own beam search (``task.build_generator``, ``task.inference_step``), the options parsed by
fairseq-generate's parser (``--beam``, ``--lenpen``, ``--max-len-a/b``, ``--batch-size`` /
``--max-tokens``, ``--fp16`` / ``--bf16``, ``--cpu``, ``--model-overrides``, ...) and its
batches made as fairseq-generate makes them (the same order by length, the same batch sizes), so
that one shard's targets are fairseq-generate's hypotheses of the training split.  OUT is a
data-bin fairseq-train reads at once:

- ``train.SRC-TGT.SRC.{bin,idx}``: the training sources as they are (a copy);
- ``train.SRC-TGT.TGT.{bin,idx}``: the teacher's best hypothesis of each (its token ids, with the
  data-bin's target dictionary: the teacher's, :func:`fairseq_deep.teacher.check_dictionaries`),
  one for each training pair, in the training set's order; an empty hypothesis (the teacher's
  end of sentence first) is kept as it is: it is the teacher's output, and dropping it would break
  the pairing (how many there were is logged);
- ``--keep-original``: the original pairs first, then the distilled ones (train = original +
  distilled: twice the pairs, the sources twice);
- ``dict.SRC.txt``, ``dict.TGT.txt`` and every ``valid*``/``test*`` file of DATA-BIN, copied;
- ``distill.json``: the run's identity (:func:`identity`: data, teacher, decoding and batching
  options, shards), so that a --destdir holding another run's work is refused in one line.

Shards (``--num-shards N --shard-id I``, fairseq's own options; here shard I decodes every N-th
batch of the training split's, from the I-th: :func:`shard_batches`) run as separate processes
(N on a CPU, one per GPU, one per node of a job array).  Whole batches of the one-shard run, so
the hypotheses are the same whatever N.  Each shard decodes its batches in chunks of
``--chunk-batches`` batches; each chunk is written to a file of its own in ``OUT/.distill/`` (a
temporary name, renamed), with a small JSON progress record beside it, so that a run killed at
any point and started again with the same command skips the chunks written and decodes the
rest, the same batches in the same order: every training pair translated exactly once.  A shard
whose chunks are all written becomes one part file (its hypotheses and their training ids); the
process that sees every shard's part (or a run without ``--shard-id``, which also decodes every
shard not yet done) merges them in the training set's order into the train split under a lock,
writes OUT's files under temporary names and renames them, and removes ``OUT/.distill/``.

Progress: a line with the ETA through fairseq's logging (:class:`fairseq_deep.progress.DecodingProgress`).

Pinned by: tests/test_distill.py.
"""

import ast
import fcntl
import glob
import json
import logging
import os
import shlex
import shutil
import signal
import sys
from typing import Dict, List, Optional

import numpy as np

from . import teacher as teachers
from .checkpoints import check_paths
from .cli import check_user_dir, with_user_dir
from .errors import UserError, report_user_errors
from .patches.arguments import option_value
from .patches.scripts import install_parsing
from .progress import DecodingProgress, interval_seconds
from .quiet import config_at_debug, quiet_warnings, script_logging

logger = logging.getLogger("fairseq_deep.distill")

PROG = "fairseq-deep-distill"
#: the run's identity in OUT
STAMP = "distill.json"
#: the work folder in OUT (chunks, progress records, the shards' parts), removed once merged
WORK = ".distill"
#: the lock the merge takes (a file in OUT, left behind: a lock file that goes away is no lock)
LOCK = ".distill.lock"
DEFAULT_CHUNK_BATCHES = 20
#: for tests: the process kills itself (SIGKILL) once it has written this many chunks and decoded
#: one more batch, as ``kill -9`` would stop it in the middle of a chunk
KILL_AFTER_ENV = "FAIRSEQ_DEEP_DISTILL_KILL_AFTER_CHUNKS"
_PATH = "--path TEACHER.pt is required: the teacher that translates the training set"


class DistillError(UserError):
    """A data-bin, teacher, option or --destdir that cannot be distilled; the message names the fix."""


# ---------------------------------------------------------------------------------------------
# what is decoded: the run's identity, the shards, the batches
# ---------------------------------------------------------------------------------------------


def _file_identity(path: str) -> Dict[str, object]:
    from .checkpoints import shard_files

    files = shard_files(path) or [path]
    return {
        "path": os.path.abspath(path),
        "files": [[os.path.basename(f), os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files],
    }


def identity(cfg, options, total: int) -> Dict[str, object]:
    """What makes a run's output what it is: the data (its folder, languages, training pairs), the
    teacher (its file(s): path, size, time of change), every decoding option of fairseq-generate
    (``cfg.generation``), the batching and precision that decide the batches and their numbers,
    the shards and chunks, ``--keep-original``.  Logging options, workers, paths of the output
    and the device are not part of it: a shard may resume, and the shards merge, on another
    machine (a job array's login node, a requeued job)."""
    from fairseq import utils
    from omegaconf import OmegaConf

    return {
        "data": os.path.abspath(utils.split_paths(cfg.task.data)[0]),
        "source_lang": cfg.task.source_lang,
        "target_lang": cfg.task.target_lang,
        "train_subset": cfg.dataset.train_subset,
        "train_pairs": total,
        "teacher": _file_identity(cfg.common_eval.path),
        "model_overrides": cfg.common_eval.model_overrides,
        "generation": OmegaConf.to_container(cfg.generation, resolve=True, enum_to_str=True),
        "max_tokens": cfg.dataset.max_tokens,
        "batch_size": cfg.dataset.batch_size,
        "required_batch_size_multiple": cfg.dataset.required_batch_size_multiple,
        "seed": cfg.common.seed,
        "fp16": cfg.common.fp16,
        "bf16": cfg.common.bf16,
        "num_shards": options.num_shards,
        "chunk_batches": options.chunk_batches,
        "keep_original": options.keep_original,
    }


def _device(cfg) -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not cfg.common.cpu else "cpu"


def split_batches(task, dataset, cfg) -> List[np.ndarray]:
    """The batches of the training split as fairseq-generate makes them: fairseq's own
    ``task.get_batch_iterator`` (the dataset's order by length, ties by a permutation under
    ``--seed``, each fairseq stack its own way) with fairseq-generate's limits, without the
    filter by length (the teacher's limit is checked on the sources: :func:`check_lengths`)."""
    iterator = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=None,
        ignore_invalid_inputs=False,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed,
        num_shards=1,
        shard_id=0,
        num_workers=0,
        data_buffer_size=cfg.dataset.data_buffer_size,
        disable_iterator_cache=True,
    )
    return [np.asarray(batch, dtype=np.int64) for batch in iterator.frozen_batches]


def shard_batches(batches: List[np.ndarray], num_shards: int, shard_id: int) -> List[np.ndarray]:
    """Shard ``shard_id``'s batches: every ``num_shards``-th batch of the split's, from the
    ``shard_id``-th (the split's batches are in order of length, so every shard gets every length
    and about the same work).  Whole batches, as the one-shard run decodes them: the same
    hypotheses whatever the number of shards (a batch of other sentences pads differently, and
    the float rounding of another padding can turn a beam's near tie)."""
    return list(batches[shard_id::num_shards])


# ---------------------------------------------------------------------------------------------
# files written atomically
# ---------------------------------------------------------------------------------------------


def _write_json(path: str, value):
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(temporary, path)


def _read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _copy(source: str, target: str):
    temporary = f"{target}.tmp{os.getpid()}"
    shutil.copyfile(source, temporary)
    os.replace(temporary, target)


class Layout:
    """The files of OUT for ``num_shards`` shards of a language pair."""

    def __init__(self, destdir: str, src: str, tgt: str, num_shards: int, vocab_size: int):
        self.destdir, self.src, self.tgt, self.num_shards = destdir, src, tgt, num_shards
        self.vocab_size = vocab_size  # the target dictionary's: the parts' integer type
        self.stamp = os.path.join(destdir, STAMP)
        self.work = os.path.join(destdir, WORK)
        self.lock = os.path.join(destdir, LOCK)

    def shard_dir(self, shard: int) -> str:
        return os.path.join(self.work, f"shard{shard}-of{self.num_shards}")

    def chunk(self, shard: int, index: int) -> str:
        return os.path.join(self.shard_dir(shard), f"chunk{index:06d}.npz")

    def progress(self, shard: int) -> str:
        return os.path.join(self.shard_dir(shard), "progress.json")

    def part(self, shard: int) -> str:
        """The prefix of shard ``shard``'s hypotheses in the order decoded (an indexed dataset;
        their training ids in ``PREFIX.ids.npy``)."""
        return os.path.join(self.work, f"part{shard}-of{self.num_shards}")

    def part_done(self, shard: int) -> str:
        return self.part(shard) + ".json"

    def train(self, lang: str) -> str:
        return os.path.join(self.destdir, f"train.{self.src}-{self.tgt}.{lang}")

    def complete(self) -> bool:
        return os.path.isfile(self.train(self.tgt) + ".idx") and not os.path.exists(self.work)


# ---------------------------------------------------------------------------------------------
# checks before anything is written
# ---------------------------------------------------------------------------------------------


def check_options(cfg, options):
    if cfg.generation.nbest != 1:
        raise DistillError(
            f"--nbest {cfg.generation.nbest}: distillation keeps one target per pair, the "
            "teacher's best: drop --nbest"
        )
    if cfg.generation.replace_unk is not None:
        raise DistillError(
            "--replace-unk: the distilled targets are the teacher's token ids in the data-bin's "
            "dictionary; a replaced word has no id there: drop --replace-unk"
        )
    if options.num_shards < 1 or not 0 <= options.shard_id < options.num_shards:
        raise DistillError(
            f"--shard-id {options.shard_id} --num-shards {options.num_shards}: the shard id is "
            f"0 ... {max(options.num_shards, 1) - 1}"
        )
    if options.chunk_batches < 1:
        raise DistillError(f"--chunk-batches {options.chunk_batches}: give 1 or more")


def check_destdir(layout: Layout, wanted: Dict[str, object]):
    """OUT is new, empty, or holds this very run's work (its stamp equals ``wanted``); else one
    line naming what differs."""
    destdir = layout.destdir
    if not os.path.exists(destdir):
        return
    if not os.path.isdir(destdir):
        raise DistillError(f"--destdir {destdir} is a file: give a folder")
    if not os.path.isfile(layout.stamp):
        if [name for name in os.listdir(destdir) if name != LOCK]:
            raise DistillError(
                f"--destdir {destdir} holds files that fairseq-deep-distill did not write (no "
                f"{STAMP}): give a new or empty folder"
            )
        return
    saved = _read_json(layout.stamp).get("identity", {})
    if saved != wanted:
        differ = [k for k in sorted(set(saved) | set(wanted)) if saved.get(k) != wanted.get(k)]
        said = "; ".join(_difference(k, saved.get(k), wanted.get(k)) for k in differ[:3])
        raise DistillError(
            f"--destdir {destdir} holds another run's distillation ({STAMP}: {said}"
            f"{'; ...' if len(differ) > 3 else ''}): give a new --destdir, or the command that "
            "wrote it to resume it"
        )


def _difference(key: str, saved, wanted) -> str:
    same_file = (
        isinstance(saved, dict)
        and isinstance(wanted, dict)
        and saved.get("path") == wanted.get("path")
    )
    if same_file:  # the teacher's file rewritten in place (another size or time of change)
        return f"{key}: {saved.get('path')} changed since"
    return f"{key}: {_short(saved)}, now {_short(wanted)}"


def _short(value) -> str:
    if isinstance(value, dict):
        value = value.get("path", value)
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def check_data(data: str, src: str, tgt: str, subset: str):
    """The training split exists, as one file pair (fairseq-train would read ``train1``... too)."""
    from fairseq.data import indexed_dataset

    found = [
        prefix
        for prefix in (
            os.path.join(data, f"{subset}.{src}-{tgt}.{src}"),
            os.path.join(data, f"{subset}.{tgt}-{src}.{src}"),
        )
        if indexed_dataset.dataset_exists(prefix, impl=None)
    ]
    if not found:
        raise DistillError(
            f"{data} has no training split {subset}.{src}-{tgt}.{{{src},{tgt}}} "
            "(fairseq-preprocess --trainpref): give the data-bin the teacher's students train on"
        )
    if any(
        indexed_dataset.dataset_exists(os.path.join(data, f"{subset}1.{pair}.{src}"), impl=None)
        for pair in (f"{src}-{tgt}", f"{tgt}-{src}")
    ):
        raise DistillError(
            f"{data} holds {subset}1.* beside {subset}.* (a training set in several files): "
            "fairseq-deep-distill distils one; binarize the training set as one file"
        )
    return found[0][: -len(f".{src}")]


def check_lengths(dataset, model, task):
    from fairseq import utils

    limit = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    limit = limit[0] if isinstance(limit, tuple) else limit
    if limit is None:
        return
    too_long = np.nonzero(np.asarray(dataset.src_sizes) > limit)[0]
    if len(too_long):
        raise DistillError(
            f"{len(too_long)} training sources are longer than the teacher's {limit} positions "
            f"(the first: pair {too_long[0]}, {dataset.src_sizes[too_long[0]]} tokens): "
            "binarize the training set without them (every pair gets a distilled target)"
        )


# ---------------------------------------------------------------------------------------------
# decoding a shard, chunk by chunk
# ---------------------------------------------------------------------------------------------


def _kill_after() -> Optional[int]:
    value = os.environ.get(KILL_AFTER_ENV, "").strip()
    return int(value) if value else None


def decode_shard(layout: Layout, shard: int, batches, decode, chunk_batches: int):
    """Decode shard ``shard``'s ``batches`` chunk by chunk, skipping the chunks written by an
    earlier run; then its part file (:func:`write_part`)."""
    os.makedirs(layout.shard_dir(shard), exist_ok=True)
    chunks = [batches[i : i + chunk_batches] for i in range(0, len(batches), chunk_batches)]
    done = [i for i in range(len(chunks)) if os.path.isfile(layout.chunk(shard, i))]
    todo = [i for i in range(len(chunks)) if i not in done]
    pairs = sum(len(b) for b in batches)
    logger.info(
        f"shard {shard + 1}/{layout.num_shards}: {pairs:,} training pairs in {len(batches):,} "
        f"batches, {len(chunks)} chunks of {chunk_batches} batches"
        + (f"; {len(done)} written by an earlier run, skipped" if done else "")
    )
    progress = DecodingProgress(
        sum(sum(len(b) for b in chunks[i]) for i in todo), interval=interval_seconds()
    )
    kill_after = _kill_after()
    written = 0
    for index in todo:
        ids, hypotheses = [], []
        for batch in chunks[index]:
            for i, tokens in decode(batch, seed_offset=index):
                ids.append(i)
                hypotheses.append(tokens)
            progress.step(len(batch))
            if kill_after is not None and written >= kill_after:
                os.kill(os.getpid(), signal.SIGKILL)  # the test hook: killed mid-chunk
        lengths = np.array([len(h) for h in hypotheses], dtype=np.int64)
        flat = np.concatenate(hypotheses) if hypotheses else np.zeros(0, dtype=np.int64)
        target = layout.chunk(shard, index)
        temporary = f"{target}.tmp{os.getpid()}"
        with open(temporary, "wb") as f:
            np.savez(f, ids=np.array(ids, dtype=np.int64), lengths=lengths, tokens=flat)
        os.replace(temporary, target)
        done.append(index)
        written += 1
        _write_json(
            layout.progress(shard),
            {
                "shard": shard,
                "num_shards": layout.num_shards,
                "pairs": pairs,
                "chunks": len(chunks),
                "chunks_done": len(done),
            },
        )
    if progress.sentences and progress.ticker.interval > 0:
        logger.info(progress.line())
    write_part(layout, shard, len(chunks))


def write_part(layout: Layout, shard: int, chunks: int):
    """The hypotheses of a shard's chunks, in the order decoded, as one indexed dataset and the
    training ids of its items (``.ids.npy``), under temporary names, renamed; its record last,
    then the chunks removed."""
    import torch
    from fairseq.data import indexed_dataset

    prefix = layout.part(shard)
    temporary = f"{prefix}.tmp{os.getpid()}"
    builder = indexed_dataset.make_builder(
        indexed_dataset.data_file_path(temporary), impl="mmap", vocab_size=layout.vocab_size
    )
    ids, empty = [], 0
    for index in range(chunks):
        with np.load(layout.chunk(shard, index)) as saved:
            offsets = np.concatenate([[0], np.cumsum(saved["lengths"])])
            for k, i in enumerate(saved["ids"].tolist()):
                tokens = saved["tokens"][offsets[k] : offsets[k + 1]]
                builder.add_item(torch.from_numpy(tokens.astype(np.int64)))
                ids.append(i)
                empty += int(len(tokens) <= 1)
    builder.finalize(indexed_dataset.index_file_path(temporary))
    with open(f"{temporary}.ids.npy", "wb") as f:
        np.save(f, np.array(ids, dtype=np.int64))
    os.replace(f"{temporary}.ids.npy", f"{prefix}.ids.npy")
    os.replace(indexed_dataset.data_file_path(temporary), indexed_dataset.data_file_path(prefix))
    os.replace(indexed_dataset.index_file_path(temporary), indexed_dataset.index_file_path(prefix))
    _write_json(layout.part_done(shard), {"pairs": len(ids), "empty": empty})
    shutil.rmtree(layout.shard_dir(shard), ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# the merge
# ---------------------------------------------------------------------------------------------


def _append(builder, prefix: str, dictionary):
    """Every item of the indexed dataset ``prefix`` appended to ``builder`` (its files copied
    where both are fairseq's mmap format)."""
    from fairseq.data import data_utils, indexed_dataset

    if indexed_dataset.infer_dataset_impl(prefix) == "mmap" and isinstance(
        builder, indexed_dataset.MMapIndexedDatasetBuilder
    ):
        builder.merge_file_(prefix)
        return
    for item in data_utils.load_indexed_dataset(prefix, dictionary):
        builder.add_item(item)


def _append_in_id_order(builder, layout: Layout, total: int):
    """The shards' hypotheses appended in the training set's order; each of the ``total``
    training ids found exactly once (else an error: nothing is written)."""
    from fairseq.data import indexed_dataset

    parts = [indexed_dataset.MMapIndexedDataset(layout.part(s)) for s in range(layout.num_shards)]
    ids = [np.load(layout.part(s) + ".ids.npy") for s in range(layout.num_shards)]
    shard_of = np.concatenate([np.full(len(i), s, dtype=np.int64) for s, i in enumerate(ids)])
    item_of = np.concatenate([np.arange(len(i), dtype=np.int64) for i in ids])
    every = np.concatenate(ids)
    if len(every) != total or not np.array_equal(np.sort(every), np.arange(total)):
        raise RuntimeError(
            f"the shards hold {len(every)} hypotheses, {len(np.unique(every))} training ids of "
            f"{total}: a bug, please report it"
        )
    where = np.empty(total, dtype=np.int64)
    where[every] = np.arange(total)
    for i in range(total):
        builder.add_item(parts[shard_of[where[i]]][int(item_of[where[i]])])


def merge(layout: Layout, data: str, original: str, task, total: int, keep_original: bool) -> bool:
    """OUT's data-bin from the shards' parts, by the process that takes the lock and finds every
    part written (the lock released by the end of the ``with``, or by the process's end); False
    where a part is missing."""
    from fairseq.data import indexed_dataset

    with open(layout.lock, "a") as lock:
        # waited for: a shard that finishes while another process looks (and finds it missing)
        # merges once that one has let go; a process that finds the merge done does nothing
        fcntl.flock(lock, fcntl.LOCK_EX)
        if layout.complete():
            return True
        missing = [s for s in range(layout.num_shards) if not os.path.isfile(layout.part_done(s))]
        if missing:
            logger.info(
                f"{layout.num_shards - len(missing)} of {layout.num_shards} shards done; the "
                f"last one to finish merges (or: the same command without --shard-id)"
            )
            return False
        src, tgt = layout.src, layout.tgt
        staged = []  # (temporary prefix, final prefix)
        for lang, parts in (
            (src, [original] * (2 if keep_original else 1)),
            (tgt, ([original] if keep_original else []) + [None]),
        ):
            dictionary = task.source_dictionary if lang == src else task.target_dictionary
            temporary = f"{layout.train(lang)}.tmp{os.getpid()}"
            builder = indexed_dataset.make_builder(
                indexed_dataset.data_file_path(temporary), impl="mmap", vocab_size=len(dictionary)
            )
            for part in parts:
                if part is None:
                    _append_in_id_order(builder, layout, total)
                else:
                    _append(builder, f"{part}.{lang}", dictionary)
            builder.finalize(indexed_dataset.index_file_path(temporary))
            staged.append((temporary, layout.train(lang)))
        for name in sorted(os.listdir(data)):
            if name.startswith(("dict.", "valid", "test")) and os.path.isfile(
                os.path.join(data, name)
            ):
                _copy(os.path.join(data, name), os.path.join(layout.destdir, name))
        for temporary, prefix in staged:
            for path in (indexed_dataset.data_file_path, indexed_dataset.index_file_path):
                os.replace(path(temporary), path(prefix))
        empty = sum(_read_json(layout.part_done(s))["empty"] for s in range(layout.num_shards))
        trash = f"{layout.work}.done{os.getpid()}"
        os.replace(layout.work, trash)  # OUT is complete from here on
        shutil.rmtree(trash, ignore_errors=True)
        pairs = len(indexed_dataset.MMapIndexedDataset(layout.train(tgt)))
        logger.info(
            f"{layout.destdir}: {pairs:,} training pairs "
            + ("(the original ones, then the distilled ones) " if keep_original else "")
            + f"with the teacher's targets ({empty:,} empty hypotheses kept); "
            f"train a student: fairseq-deep-train {layout.destdir} --arch ..."
        )
        return True


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------


def checked():
    """Everything checked: fairseq's INFO lines and ours from here on (WARNING until now, so that
    a refusal is the only line)."""
    logging.getLogger().setLevel(os.environ.get("LOGLEVEL", "INFO").upper())


def distill(cfg, options):
    """Decode the shards this process is given and merge when every shard is done (module
    docstring); ``options``: the parsed namespace (destdir, shard_id, num_shards, given_shard,
    chunk_batches, keep_original, command)."""
    import torch
    from fairseq import tasks, utils

    check_options(cfg, options)
    task = tasks.setup_task(cfg.task)
    src, tgt = task.cfg.source_lang, task.cfg.target_lang
    data = utils.split_paths(cfg.task.data)[0]
    original = check_data(data, src, tgt, cfg.dataset.train_subset)
    task.load_dataset(cfg.dataset.train_subset)
    dataset = task.dataset(cfg.dataset.train_subset)
    total = len(dataset)
    layout = Layout(options.destdir, src, tgt, options.num_shards, len(task.target_dictionary))
    wanted = identity(cfg, options, total)
    check_destdir(layout, wanted)
    if layout.complete():
        checked()
        for trash in glob.glob(f"{layout.work}.done*"):  # a merge killed while it cleaned up
            shutil.rmtree(trash, ignore_errors=True)
        logger.info(f"{layout.destdir} is complete: nothing to do")
        return
    shards = [options.shard_id] if options.given_shard else range(options.num_shards)
    shards = [s for s in shards if not os.path.isfile(layout.part_done(s))]
    decode = None
    if shards:
        use_cuda = _device(cfg) == "cuda"
        dtype = torch.float16 if cfg.common.fp16 else torch.bfloat16 if cfg.common.bf16 else None
        model = teachers.load(
            cfg.common_eval.path,
            task,
            overrides=ast.literal_eval(cfg.common_eval.model_overrides),
            device="cuda" if use_cuda else None,
            dtype=dtype,
        )
        model.prepare_for_inference_(cfg)
        check_lengths(dataset, model, task)
        decode = decoder(cfg, task, dataset, model, use_cuda)
    checked()
    os.makedirs(layout.destdir, exist_ok=True)
    if not os.path.isfile(layout.stamp):  # first (a concurrent shard's check sees it or nothing)
        _write_json(layout.stamp, {"identity": wanted, "command": options.command})
    os.makedirs(layout.work, exist_ok=True)
    batches = split_batches(task, dataset, cfg) if shards else []
    for shard in shards:
        of_shard = shard_batches(batches, options.num_shards, shard)
        decode_shard(layout, shard, of_shard, decode, options.chunk_batches)
    merge(layout, data, original, task, total, options.keep_original)


def decoder(cfg, task, dataset, model, use_cuda):
    """``decode(batch, seed_offset) -> [(id, tokens)]``: fairseq-generate's decoding of a batch of
    training ids (its sample, generator and inference step), each best hypothesis's token ids
    ending with </s>; ``--seed`` + the chunk's index seeds each chunk (sampling resumes as it
    would have run)."""
    import torch
    from fairseq import utils

    generator = task.build_generator(
        [model], cfg.generation, extra_gen_cls_kwargs={"lm_model": None, "lm_weight": 0.0}
    )
    eos = task.target_dictionary.eos()

    def decode(batch, seed_offset=0):
        if cfg.common.seed is not None and not cfg.generation.no_seed_provided:
            utils.set_torch_seed(cfg.common.seed + seed_offset)
        sample = dataset.collater([dataset[int(i)] for i in batch])
        if use_cuda:
            sample = utils.move_to_cuda(sample)
        prefix_tokens = None
        if cfg.generation.prefix_size > 0:
            prefix_tokens = sample["target"][:, : cfg.generation.prefix_size]
        with torch.no_grad():
            hypos = task.inference_step(
                generator, [model], sample, prefix_tokens=prefix_tokens, constraints=None
            )
        out = []
        for k, i in enumerate(sample["id"].tolist()):
            tokens = hypos[k][0]["tokens"].int().cpu().numpy().astype(np.int64)
            if len(tokens) == 0 or tokens[-1] != eos:
                tokens = np.append(tokens, eos)
            out.append((i, tokens))
        return out

    return decode


def add_distill_args(parser):
    group = parser.add_argument_group("distillation (fairseq-deep-distill)")
    group.add_argument(
        "--destdir",
        required=True,
        metavar="OUT",
        help="the data-bin to write: the training sources with the teacher's targets, the "
        "dictionaries, valid and test",
    )
    group.add_argument(
        "--keep-original",
        action="store_true",
        help="train = the original pairs, then the distilled ones",
    )
    group.add_argument(
        "--chunk-batches",
        type=int,
        default=DEFAULT_CHUNK_BATCHES,
        metavar="K",
        help=f"batches per chunk written (what a resumed run keeps; default {DEFAULT_CHUNK_BATCHES})",
    )
    return parser


def main(command: str):
    """Parse fairseq-generate's options and ours from ``sys.argv`` and distil; ``command``: the
    command line as given (for the stamp)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    check_user_dir(sys.argv)
    parser = add_distill_args(options.get_generation_parser())
    parser.prog = PROG
    args = options.parse_args_and_arch(parser)
    argv = sys.argv[1:]
    args.command = command
    args.given_shard = option_value(argv, "--shard-id") is not None
    if option_value(argv, "--num-shards") is None:  # the --destdir's, else one
        args.num_shards = _stamped_shards(args.destdir) or 1
    if args.max_tokens is None and args.batch_size is None:
        args.max_tokens = 12000  # fairseq-generate's default
    cfg = convert_namespace_to_omegaconf(args)
    distill(cfg, args)


def _stamped_shards(destdir: str) -> Optional[int]:
    stamp = os.path.join(destdir, STAMP)
    if not os.path.isfile(stamp):
        return None
    return _read_json(stamp).get("identity", {}).get("num_shards")


def cli_main():
    quiet_warnings()
    script_logging("stdout", level="WARNING")  # INFO once the checks passed (distill)
    config_at_debug()  # fairseq's whole configuration: LOGLEVEL=DEBUG shows it
    install_parsing(
        {"path": _PATH}, (check_paths,)
    )  # argparse's errors in one line; --path required
    command = shlex.join([PROG, *sys.argv[1:]])
    sys.argv = with_user_dir(sys.argv)
    report_user_errors(lambda: main(command), PROG)


if __name__ == "__main__":
    cli_main()
