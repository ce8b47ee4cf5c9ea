"""examples/export (docs/export.md): translate.py's output without the warnings a normal run keeps
off (fairseq_deep.quiet), and run.sh's input read plain or gzip as the own-data recipe takes it."""

import gzip
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "export")


def test_translate_py_prints_no_deprecation_of_fairseqs_pins():
    """Issue 46: fairseq's import of fairscale warned that torch.cuda.amp.custom_fwd is deprecated
    (a FutureWarning) on every run of translate.py; the filters of fairseq_deep.quiet drop it, and
    only it: a user's -W still shows what the package imports."""
    pytest.importorskip("ctranslate2")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTHONWARNINGS", None)
    script = os.path.join(EXAMPLE, "translate.py")
    proc = subprocess.run(
        [sys.executable, script, "--help"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0 and "--compute-type" in proc.stdout, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    # the filters are the package's exact ones, not all warnings: -W error stops the import
    loud = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", script, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    fairscale = subprocess.run([sys.executable, "-c", "import fairscale"], capture_output=True)
    if fairscale.returncode == 0:
        assert loud.returncode != 0 and "FutureWarning" in loud.stderr, loud.stderr


STUBS = {  # the programs run.sh runs, standing in for a dry run: they record what they are given
    "fairseq-deep-export": 'while [ "$1" != --out ]; do shift; done; mkdir -p "$2"\n',
    "fairseq-generate": 'echo "2026-01-01 | INFO | fairseq_cli.generate | Generate test"\n',
    "fairseq-deep-score": 'echo "$*" >> "$STUB_OUT/score.args"\n',
    # python "$HERE/translate.py" ...: what it reads on its standard input, one line out per line in
    "python": 'cat > "$STUB_OUT/translate.stdin"\ncat "$STUB_OUT/translate.stdin"\n',
}


def test_run_sh_reads_a_gzip_input_as_the_recipe_takes_it(tmp_path):
    """Issue 46: run.sh gave translate.py the bytes of Multi30k's test_2016_flickr.de.gz; it reads
    a .gz INPUT through gzip (a plain one as it is), and passes the reference on as it is stored
    (fairseq-deep-score reads .gz itself)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\nset -eu\n" + body)
        (bin_dir / name).chmod(0o755)
    text = "ein kleines Haus .\nzwei Hunde laufen .\n"
    gz = tmp_path / "test_2016_flickr.de.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(text)
    plain = tmp_path / "test.de"
    plain.write_text(text, encoding="utf-8")
    ref = tmp_path / "test_2016_flickr.en.gz"
    with gzip.open(ref, "wt", encoding="utf-8") as f:
        f.write("a small house .\ntwo dogs run .\n")
    env = dict(
        os.environ,
        PATH=os.pathsep.join([str(bin_dir), os.environ["PATH"]]),
        STUB_OUT=str(tmp_path),
        DEVICE_ARGS="--cpu",
        COMPUTE_TYPE="int8",
    )
    for source in (gz, plain):
        work = tmp_path / f"work_{source.name}"
        proc = subprocess.run(
            ["bash", os.path.join(EXAMPLE, "run.sh"), "model.pt", "bin", str(work), str(source)]
            + ["", str(ref)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=str(tmp_path),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (tmp_path / "translate.stdin").read_text(encoding="utf-8") == text, source
        assert "ct2 (int8): 2 translations" in proc.stdout
    assert f"--ref {ref}" in (tmp_path / "score.args").read_text()
