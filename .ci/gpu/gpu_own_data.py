"""The own-data recipe on the GPU machine as a new user runs it (issue 47, item 2): a window step.

    python .ci/gpu/gpu_own_data.py --raw .gpu/multi30k --work W [--minutes 5]
        [--arch transformer_dlcl_30l] [--precision=--fp16] [--env NAME=VALUE ...]

runs ``PRECISION=--fp16 MINUTES=5 SRC=de TGT=en RAW=W/raw WORK=W/run bash
examples/own_data/run.sh ARCH`` from the repository root, as README's "Your own data" says, on
Multi30K's raw text (``--raw``: the folder ``gpu_session.py stage`` fills; its files linked into
``W/raw`` under the names run.sh reads: ``train.*``, ``val.*``, ``test.*``).  Everything else is the
recipe's CUDA defaults (Base width, its learning rate, warm-up and batch): what a user gets.

The GPU machine has the package and fairseq on ``PYTHONPATH`` but none of their console scripts
(``../shared/gpu/README.md``), and run.sh calls ``python`` and ``fairseq-deep-*``: ``W/bin`` gets a
launcher for each console script of setup.py and for ``python`` (this Python), first on run.sh's
``PATH``.  ``--env NAME=VALUE`` sets more of run.sh's settings (``gpu_session.py run --tiny``: on
this CPU, ``DEVICE=--cpu WIDTH=16 ...``).  The exit status is run.sh's; its log is this step's,
and W/run's train.log, generate.out and score.txt come back in the window's tarball.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
from typing import Dict, List

from gpu_steps import ROOT

#: the raw files run.sh reads, and Multi30K's names of them
RAW_NAMES = {"train": "train", "val": "val", "test": "test_2016_flickr"}
#: setup.py's console scripts: ``name = module:function``
CONSOLE_SCRIPT = re.compile(r'"([\w.-]+) = ([\w.]+):(\w+)"')


def console_scripts(setup_py: str = os.path.join(ROOT, "setup.py")) -> Dict[str, str]:
    """setup.py's console scripts: ``{name: "module:function"}``."""
    with open(setup_py, encoding="utf-8") as f:
        return {name: f"{mod}:{fn}" for name, mod, fn in CONSOLE_SCRIPT.findall(f.read())}


def write_launchers(folder: str, python: str = sys.executable) -> List[str]:
    """A launcher in ``folder`` for ``python`` and for each console script (as pip would write
    it, run by ``python``); returns their names."""
    os.makedirs(folder, exist_ok=True)
    python = shlex.quote(python)
    scripts = {"python": f'exec {python} "$@"'}
    for name, target in console_scripts().items():
        module, function = target.split(":")
        code = f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; "
        scripts[name] = f'exec {python} -c "{code}sys.exit({function}())" "$@"'
    for name, body in scripts.items():
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\n{body}\n")
        os.chmod(path, 0o755)
    return sorted(scripts)


def link_raw(raw: str, folder: str, src: str = "de", tgt: str = "en"):
    """Multi30K's raw files of ``raw`` linked into ``folder`` as ``train.*``, ``val.*``,
    ``test.*`` (one line naming what is missing)."""
    os.makedirs(folder, exist_ok=True)
    for name, multi30k in RAW_NAMES.items():
        for lang in (src, tgt):
            source = os.path.abspath(os.path.join(raw, f"{multi30k}.{lang}.gz"))
            if not os.path.isfile(source):
                raise SystemExit(f"gpu_own_data.py: --raw {raw} has no {multi30k}.{lang}.gz")
            target = os.path.join(folder, f"{name}.{lang}.gz")
            if not os.path.lexists(target):
                os.symlink(source, target)


def get_parser():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--raw", required=True, help="Multi30K de-en's raw text (gzip)")
    p.add_argument(
        "--work", required=True, help="the launchers, the linked raw text, run.sh's WORK"
    )
    p.add_argument("--arch", default="transformer_dlcl_30l")
    p.add_argument("--minutes", default="5", help="run.sh's MINUTES")
    p.add_argument("--precision", default="--fp16", help="run.sh's PRECISION (--precision=...)")
    p.add_argument(
        "--env",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="more of run.sh's settings",
    )
    return p


def main(argv=None) -> int:
    a = get_parser().parse_args(argv)
    bad = [e for e in a.env if "=" not in e]
    if bad:
        raise SystemExit(f"gpu_own_data.py: --env {' '.join(bad)}: give NAME=VALUE")
    bin_dir, raw = os.path.join(a.work, "bin"), os.path.join(a.work, "raw")
    write_launchers(bin_dir)
    link_raw(a.raw, raw)
    env = dict(
        os.environ,
        PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        SRC="de",
        TGT="en",
        RAW=raw,
        WORK=os.path.join(a.work, "run"),
        MINUTES=a.minutes,
        PRECISION=a.precision,
        **dict(e.split("=", 1) for e in a.env),
    )
    command = ["bash", os.path.join("examples", "own_data", "run.sh"), a.arch]
    settings = {k: env[k] for k in ("MINUTES", "PRECISION", "RAW", "WORK")}
    print(" ".join(f"{k}={v}" for k, v in settings.items()), *a.env, *command, flush=True)
    return subprocess.run(command, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
