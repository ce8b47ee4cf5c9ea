"""Fully sharded training (``--ddp-backend fully_sharded``, fairscale's FSDP) of the deep families on
one GPU, checked against fairseq's ``c10d`` backend (issue 31).

For each model it trains the same updates (seed 1, dropout 0, ``--log-interval 1``) under each mode
and reports, per run: the per-update losses' largest difference from the mode's reference run (the
same precision under ``c10d``), the parameter count that ``fairseq-train`` logs (equal to c10d's?),
the peak GPU memory (``torch.cuda.max_memory_allocated``) and the process's peak resident memory;
then, for the first fully sharded mode of each model, whether ``fairseq-generate`` decodes its
checkpoint (a tenth of the test set) and whether training resumes from it (``--max-update`` +10:
the log says it loaded update N and the loss goes on); mode ``fsdp_fp32_sharded`` saves each rank's
shard (``--use-sharded-state``), which fairseq-generate reads as one model through this package's
loader (fairseq issues #4275, #4307; docs/fully_sharded.md).  ``--depths`` measures the peak memory of
DeepNorm N+N at width 512 for a few updates, with and without sharding + offload, from which the
largest depth that fits is extrapolated (linear in N; the measured points are in the table).

    # on the GPU machine (fairscale from ../shared/gpu/wheels, see .ci/gpu/gpu_session.py)
    python3 -m benchmarks.fsdp_check --data .gpu/m30k/data-bin --work /tmp/fsdp --json fsdp.json
    python3 -m benchmarks.fsdp_check ... --models dlcl_30_6 --modes c10d_fp32 fsdp_fp32

Each run is fairseq-train's own ``cli_main`` in a process of its own that measures its peak memory
(:func:`fairseq_deep.runs.execute_together`: fairseq resets the peak after every update, the
largest is kept).  FSDP needs CUDA (fairscale creates CUDA streams): with
``--device cpu`` only the c10d runs train (a check of the script itself);
``tests/test_fully_sharded.py`` checks on CPU what would be wrapped.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/fsdp_check.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.fsdp_check"
    )

import argparse
import glob
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

from fairseq_deep import runs
from fairseq_deep.runs import Part, recipes

from . import harness

ROOT = harness.ROOT

_NO_DROPOUT = list(recipes.dropout("0", "0", "0"))
_W256 = list(recipes.transformer_size(256, 1024, 4))

#: the issue's models: DLCL 30+6 and TA 16+6 at their presets' width (512), DeepNorm 100+100 at
#: width 256, Admin (its profile is written in the first forward), and one recurrent family
MODELS: Dict[str, List[str]] = {
    "dlcl_30_6": ["--arch", "transformer_dlcl_30l", *_NO_DROPOUT],
    "ta_16_6": ["--arch", "transformer_ta_16l", *_NO_DROPOUT],
    "deepnorm_100_100": [
        "--arch",
        "transformer_deepnorm",
        *recipes.layers(100, 100),
        *_W256,
        *_NO_DROPOUT,
    ],
    "admin_18_18": ["--arch", "transformer_admin_18l", *_W256, *_NO_DROPOUT],
    "rnmt_plus": ["--arch", "rnmt_plus", *recipes.layers(4, 4), *recipes.dropout("0")],
}

#: mode -> (flags, the mode whose losses it must equal)
MODES: Dict[str, tuple] = {
    "c10d_fp32": (["--ddp-backend", "c10d"], None),
    "fsdp_fp32": (["--ddp-backend", "fully_sharded"], "c10d_fp32"),
    "fsdp_fp32_ckpt": (["--ddp-backend", "fully_sharded", "--checkpoint-activations"], "c10d_fp32"),
    "fsdp_fp32_ckpt_offload": (
        ["--ddp-backend", "fully_sharded", "--checkpoint-activations", "--cpu-offload"],
        "c10d_fp32",
    ),
    # fairseq issues #4275 and #4307: each rank saves its own shard (checkpoint_last-shard0.pt);
    # fairseq-generate decodes it (the shards consolidated on loading) and training resumes from it
    "fsdp_fp32_sharded": (
        ["--ddp-backend", "fully_sharded", "--use-sharded-state"],
        "c10d_fp32",
    ),
    "c10d_fp16": (["--ddp-backend", "c10d", "--fp16"], None),
    "fsdp_fp16": (["--ddp-backend", "fully_sharded", "--fp16"], "c10d_fp16"),
    "fsdp_fp16_ckpt_offload": (
        ["--ddp-backend", "fully_sharded", "--fp16", "--checkpoint-activations", "--cpu-offload"],
        "c10d_fp16",
    ),
    # c10d's --bf16 keeps bfloat16 weights (float32 master copies for the update); FSDP's keeps
    # float32 parameters and computes in bfloat16: both are compared with float32 (an H200 run:
    # c10d bf16 0.25 from it at update 5, FSDP bf16 0.004)
    "c10d_bf16": (["--ddp-backend", "c10d", "--bf16"], "c10d_fp32"),
    "fsdp_bf16": (["--ddp-backend", "fully_sharded", "--bf16"], "c10d_fp32"),
}

#: the plan of one GPU window: (model, modes), most informative first
PLAN = [
    (
        "dlcl_30_6",
        [
            "c10d_fp32",
            "fsdp_fp32",
            "fsdp_fp32_ckpt",
            "c10d_fp16",
            "fsdp_fp16_ckpt_offload",
            "c10d_bf16",
            "fsdp_bf16",
        ],
    ),
    (
        "deepnorm_100_100",
        ["c10d_fp32", "fsdp_fp32", "fsdp_fp32_ckpt", "c10d_fp16", "fsdp_fp16_ckpt_offload"],
    ),
    (
        "ta_16_6",
        ["c10d_fp32", "fsdp_fp32", "fsdp_fp32_ckpt", "c10d_fp16", "fsdp_fp16_ckpt_offload"],
    ),
    ("admin_18_18", ["c10d_fp16", "fsdp_fp16"]),
    ("rnmt_plus", ["c10d_fp32", "fsdp_fp32", "c10d_fp16", "fsdp_fp16"]),
]

_DEEPNORM_512 = [
    "--arch",
    "transformer_deepnorm",
    *recipes.transformer_size(512, 2048, 8),
    *_NO_DROPOUT,
]

_DEVICE_FLAGS: List[str] = []
_EXTRA_MODEL_FLAGS: List[str] = []


def train_command(
    data: str,
    save_dir: str,
    model_flags: List[str],
    mode_flags: List[str],
    updates: int,
    max_tokens: int,
) -> runs.Run:
    """fairseq-train of a model in a mode: Adam (0.9, 0.98) with inverse_sqrt warm-up over 100
    updates to 5e-4, a loss logged every update, no validation."""
    return runs.Run.of(
        "train",
        data,
        Part("model", model_flags),
        Part("mode", mode_flags),
        recipes.adam("5e-4"),
        recipes.inverse_sqrt(100),
        recipes.label_smoothed(0.1),
        recipes.budget(max_tokens=max_tokens, max_update=updates),
        recipes.seed("1"),
        recipes.saving(save_dir=save_dir, no_epoch_checkpoints=True, disable_validation=True),
        recipes.json_log(1),
        ["--num-workers", "0"],
        Part("device", _DEVICE_FLAGS),
        Part("model_flags", _EXTRA_MODEL_FLAGS),
    )


def parse_log(result: runs.Result) -> Dict:
    """Losses by update, the logged parameter count, the update a resumed run started from, peaks."""
    losses, out = {}, dict(result.peaks)
    for rec in result.records:
        if rec["kind"] == "train_inner":
            losses[int(rec["num_updates"])] = float(rec["loss"])
            if "loss_scale" in rec:
                out["loss_scale"] = float(rec["loss_scale"])
    params, resumed = runs.parse_params(result.output), runs.parse_loaded_update(result.output)
    if params is not None:
        out["params"] = params
    if resumed is not None:
        out["resumed_from"] = resumed
    out["losses"] = losses
    return out


def _summary(result: runs.Result, out: Dict) -> Dict:
    out.update(
        status="timeout" if result.timed_out else result.returncode,
        seconds=round(result.seconds, 1),
    )
    if not result.ok:
        out["tail"] = "\n".join(result.output.splitlines()[-6:])[-1200:]
    return out


def run(train: runs.Run, log_path: str, timeout: float, env=None) -> Dict:
    """fairseq-train in a process of its own that measures its peak memories
    (:func:`fairseq_deep.runs.execute_together`)."""
    (result,) = runs.execute_together([train], log_path, timeout=max(timeout, 1), env=env)
    return _summary(result, parse_log(result))


def generate(data: str, checkpoint: str, log_path: str, timeout: float) -> Dict:
    decode = runs.Run.of(
        "generate",
        data,
        recipes.decoding(path=checkpoint, gen_subset="test", beam=4, max_tokens=8192),
        ["--distributed-world-size", "10", "--distributed-rank", "0"],
        recipes.decoding(remove_bpe="sentencepiece"),
    )
    result = runs.execute(decode, log_path, timeout=max(timeout, 1))
    out = _summary(result, {})
    generated = result.generated
    hyps, bleu = len(generated.tokens), generated.bleu4
    return {
        "status": out["status"],
        "hypotheses": hyps,
        "bleu": float(bleu) if bleu else None,
        "seconds": out["seconds"],
        **({"tail": out["tail"]} if "tail" in out else {}),
    }


def max_diff(a: Dict[int, float], b: Dict[int, float]) -> Optional[float]:
    common = sorted(set(a) & set(b))
    return max(abs(a[u] - b[u]) for u in common) if common else None


def train_one(a, model: str, mode: str, deadline: float) -> Dict:
    save = os.path.join(a.work, model, mode)
    os.makedirs(save, exist_ok=True)
    cmd = train_command(a.data, save, MODELS[model], MODES[mode][0], a.updates, a.max_tokens)
    env = dict(os.environ, OMP_NUM_THREADS="4" if "offload" in mode else "2")
    return dict(
        model=model,
        mode=mode,
        **run(cmd, os.path.join(save, "train.log"), deadline - time.monotonic(), env),
    )


def generate_and_resume(a, row: Dict, deadline: float):
    """``fairseq-generate`` on the run's checkpoint, then training resumed from it for 10 updates."""
    save = os.path.join(a.work, row["model"], row["mode"])
    ckpt = os.path.join(save, "checkpoint_last.pt")
    saved = os.path.exists(ckpt) or os.path.exists(ckpt[: -len(".pt")] + "-shard0.pt")
    if row["status"] != 0 or not saved or deadline - time.monotonic() < 30:
        return
    row["generate"] = generate(
        a.data, ckpt, os.path.join(save, "generate.log"), min(120, deadline - time.monotonic())
    )
    cmd = train_command(
        a.data, save, MODELS[row["model"]], MODES[row["mode"]][0], a.updates + 10, a.max_tokens
    )
    resumed = run(cmd, os.path.join(save, "resume.log"), min(180, deadline - time.monotonic()))
    row["resume"] = {
        "status": resumed["status"],
        "from": resumed.get("resumed_from"),
        "last_update": max(resumed["losses"], default=None),
        **({"tail": resumed["tail"]} if "tail" in resumed else {}),
    }


def compare(rows: Dict[str, Dict]):
    """Each run against its mode's reference run: largest loss difference, equal parameter count."""
    for mode, row in rows.items():
        reference = rows.get(MODES[mode][1])
        if reference is not None:
            row["max_loss_diff"] = max_diff(row["losses"], reference["losses"])
            row["params_equal"] = row.get("params") == reference.get("params")


def depth_one(a, depth: int, mode: str, deadline: float) -> Dict:
    save = os.path.join(a.work, "depth", f"{depth}_{mode}")
    os.makedirs(save, exist_ok=True)
    flags = [*_DEEPNORM_512, *recipes.layers(depth, depth), *recipes.saving(no_save=True)]
    cmd = train_command(a.data, save, flags, MODES[mode][0], a.depth_updates, 4096)
    out = run(
        cmd,
        os.path.join(save, "train.log"),
        deadline - time.monotonic(),
        dict(os.environ, OMP_NUM_THREADS="8"),
    )
    out.pop("losses", None)
    return dict(depth=depth, mode=mode, **out)


def _cell(value, fmt="{}"):
    return "" if value is None else fmt.format(value)


def table(rows: List[Dict]) -> str:
    lines = []
    for r in rows:
        params = _cell(r.get("params"), "{:,}") + (
            "" if r.get("params_equal", True) else " (differs)"
        )
        gen, res = r.get("generate"), r.get("resume")
        gen = (
            ""
            if not gen
            else f"{gen['hypotheses']} hyps, BLEU {gen['bleu']}, status {gen['status']}"
        )
        res = (
            "" if not res else f"from {res['from']} to {res['last_update']}, status {res['status']}"
        )
        lines.append(
            [
                r["model"],
                r["mode"],
                r["status"],
                params,
                _cell(r.get("max_loss_diff"), "{:.2e}"),
                _cell(r.get("loss_scale")),
                _cell(r.get("peak_gpu_gb")),
                _cell(r.get("peak_rss_gb")),
                r["seconds"],
                gen,
                res,
            ]
        )
    return harness.markdown_table(
        [
            "model",
            "mode",
            "status",
            "params",
            "max loss diff",
            "loss scale",
            "peak GPU GB",
            "peak RSS GB",
            "s",
            "generate",
            "resume",
        ],
        lines,
    )


def get_parser():
    p = harness.parser(__doc__, epilog=__doc__)
    p.add_argument("--data", required=True, help="binarized data (fairseq-preprocess)")
    p.add_argument("--work", default="/tmp/fsdp_check", help="checkpoints and logs")
    harness.add_json(p, help="write every row here")
    p.add_argument(
        "--models", nargs="+", choices=list(MODELS), help="only these models (of the plan)"
    )
    p.add_argument("--modes", nargs="+", choices=list(MODES), help="only these modes (of the plan)")
    p.add_argument("--only", nargs="+", metavar="MODEL:MODE", help="these runs instead of the plan")
    p.add_argument("--updates", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--jobs", type=int, default=6, help="training runs at once")
    p.add_argument("--budget", type=float, default=420, help="seconds for everything")
    p.add_argument(
        "--depths", type=int, nargs="*", default=[64, 128], help="DeepNorm N+N (width 512) to probe"
    )
    p.add_argument("--depth-updates", type=int, default=3)
    p.add_argument(
        "--model-flags",
        nargs=argparse.REMAINDER,
        default=[],
        help="appended to every model's flags (e.g. tiny sizes for a check of the script itself)",
    )
    harness.add_device_argument(
        p,
        note="fully sharded training needs CUDA (fairscale's FSDP creates CUDA "
        "streams): on cpu only the c10d runs train, a check of the script itself",
    )
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    harness.device_from_args(a)
    _DEVICE_FLAGS[:] = harness.train_flags(a.device)
    _EXTRA_MODEL_FLAGS[:] = a.model_flags
    a.data, a.work = os.path.abspath(a.data), os.path.abspath(a.work)
    deadline = time.monotonic() + a.budget
    plan = [
        (model, [m for m in modes if not a.modes or m in a.modes])
        for model, modes in PLAN
        if not a.models or model in a.models
    ]
    if a.only:
        pairs = [x.split(":") for x in a.only]
        bad = [
            x for x, (model, mode) in zip(a.only, pairs) if model not in MODELS or mode not in MODES
        ]
        if bad:
            raise SystemExit(
                f"fsdp_check.py: no such MODEL:MODE {', '.join(bad)} (models {', '.join(MODELS)}; "
                f"modes {', '.join(MODES)})"
            )
        plan = [
            (model, [mode for mo, mode in pairs if mo == model])
            for model in dict.fromkeys(mo for mo, _ in pairs)
        ]
    if a.device == "cpu":
        print(
            "fsdp_check.py: --device cpu: the c10d runs only (fully sharded training needs CUDA; "
            "tests/test_fully_sharded.py checks the wrapping on CPU)"
        )
        plan = [(model, [m for m in modes if m.startswith("c10d")]) for model, modes in plan]
        a.depths = []
    rows: List[Dict] = []
    depth_rows: List[Dict] = []

    def save():
        if a.json:
            harness.write_json(a.json, {"runs": rows, "depths": depth_rows})

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        trainings = {
            (model, mode): pool.submit(train_one, a, model, mode, deadline)
            for model, modes in plan
            for mode in modes
        }
        followups = []
        for model, modes in plan:
            by_mode = {mode: trainings[(model, mode)].result() for mode in modes}
            compare(by_mode)
            rows += by_mode.values()
            first_fsdp = next(
                (r for m, r in by_mode.items() if m.startswith("fsdp") and r["status"] == 0), None
            )
            if first_fsdp is not None:
                followups.append(pool.submit(generate_and_resume, a, first_fsdp, deadline))
            save()
        depths = [
            pool.submit(depth_one, a, d, mode, deadline)
            for d in a.depths
            for mode in ("c10d_fp16", "fsdp_fp16_ckpt_offload")
        ]
        depth_rows += [f.result() for f in depths]
        for f in followups:
            f.result()
    for path in glob.glob(os.path.join(a.work, "**", "checkpoint*.pt"), recursive=True):
        os.remove(path)
    save()
    print(table(rows))
    for r in depth_rows:
        print(
            f"DeepNorm {r['depth']}+{r['depth']} width 512 {r['mode']}: status {r['status']}, "
            f"peak GPU {r.get('peak_gpu_gb')} GB, peak RSS {r.get('peak_rss_gb')} GB, params {r.get('params')}, "
            f"{r['seconds']} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
