"""Why does transformer_dlcl start at a higher loss than the pre-norm Transformer (issue 26, item 8)?

Reported: at Base width with shared embeddings (examples/own_data/run.sh), transformer_dlcl's first
logged loss was 25.2 where transformer_prenorm's was 15.5 (the decoder's DLCL alone: 24.9).

Part 1 (in process, no training): for each model at initialisation, on the first sentences of the
valid set, the loss (nll, bits as fairseq logs it), the logit the decoder gives the token it was
just fed (its input token, ``prev_output_tokens``), and how often that token is the argmax, with
tied (``--share-all-embeddings``) and untied output embeddings.

Part 2 (``--updates N``): fairseq-train of transformer_prenorm and transformer_dlcl side by side,
same data, seed and schedule (tied embeddings, or ``--untied``), logging every ``--log-interval``
updates; the table gives each one's loss at the logged updates and their difference.

    python -m benchmarks.dlcl_init_loss --data DATA_BIN --width 512 --updates 200 --warmup 100
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/dlcl_init_loss.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.dlcl_init_loss"
    )

import json
import math
import os

from fairseq_deep import runs
from fairseq_deep.runs import Part, recipes

from . import harness
from .harness import add_device_argument, device_from_args

PLUGIN = runs.PLUGIN_DIR

CASES = [  # (name, arch, extra flags)
    ("pre-norm", "transformer_prenorm", []),
    ("DLCL (both stacks)", "transformer_dlcl", []),
    ("DLCL encoder only", "transformer_dlcl", ["--dlcl-stacks", "encoder"]),
    ("DLCL decoder only", "transformer_dlcl", ["--dlcl-stacks", "decoder"]),
    ("DLCL --dlcl-init residual", "transformer_dlcl", ["--dlcl-init", "residual"]),
]


def width_flags(width: int):
    """Embeddings ``width``, FFN 4x, one head per 64 (at least one)."""
    return list(recipes.transformer_size(width, 4 * width, max(1, width // 64)))


def at_initialisation(args, device):
    import torch
    from fairseq import options, tasks

    import fairseq_deep  # noqa: F401  (registers the architectures)

    rows = []
    for tied in (True, False):
        for name, arch, extra in CASES:
            parser = options.get_training_parser()
            cfg = options.parse_args_and_arch(
                parser,
                [
                    args.data,
                    "--arch",
                    arch,
                    *extra,
                    *width_flags(args.width),
                    *recipes.seed("1"),
                    *(["--share-all-embeddings"] if tied else []),
                    "--user-dir",
                    PLUGIN,
                ],
            )
            torch.manual_seed(1)
            task = tasks.setup_task(cfg)
            task.load_dataset(args.subset)
            model = task.build_model(cfg).to(device).train()  # dropout as in training
            data = task.dataset(args.subset)
            batch = data.collater([data[i] for i in range(min(args.sentences, len(data)))])
            net = {k: v.to(device) for k, v in batch["net_input"].items()}
            target, prev = batch["target"].to(device), net["prev_output_tokens"]
            with torch.no_grad():
                logits = model(**net)[0].float()
            real = target.ne(task.target_dictionary.pad())
            nll = -torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)[real]
            fed = logits.gather(-1, prev.unsqueeze(-1)).squeeze(-1)[real]
            rows.append(
                dict(
                    model=name,
                    tied=tied,
                    nll_bits=round(nll.mean().item() / math.log(2), 2),
                    fed_token_logit=round(fed.mean().item(), 2),
                    logit_std=round(logits.std().item(), 2),
                    argmax_is_fed_token=round(
                        (logits.argmax(-1) == prev)[real].float().mean().item(), 3
                    ),
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def train_run(args, arch, save_dir) -> runs.Run:
    """fairseq-train of ``arch``: tied embeddings unless --untied, the study's optimiser (Adam
    (0.9, 0.98), inverse_sqrt warm-up), no validation, no checkpoints, json records."""
    return runs.Run.of(
        "train",
        args.data,
        Part("model", ["--arch", arch, *width_flags(args.width)]),
        [] if args.untied else ["--share-all-embeddings"],
        recipes.adam(args.lr),
        recipes.inverse_sqrt(args.warmup),
        recipes.label_smoothed(0.1),
        recipes.budget(max_tokens=args.max_tokens, max_update=args.updates),
        recipes.seed("1"),
        recipes.json_log(args.log_interval),
        recipes.saving(disable_validation=True, no_save=True, save_dir=save_dir),
        ["--num-workers", "0"],
        recipes.device(args.device),
    )


def train_losses(args, arch, save_dir):
    trained = runs.execute(train_run(args, arch, save_dir))
    if not trained.ok:
        raise SystemExit(
            f"fairseq-train {arch} failed (exit {trained.returncode}): {trained.error()}"
        )
    return {
        int(r["num_updates"]): float(r["loss"])
        for r in trained.records
        if r["kind"] == "train_inner"
    }


def get_parser():
    p = harness.parser(__doc__)
    p.add_argument(
        "--data",
        required=True,
        help="fairseq-preprocess output (joint dictionary for tied embeddings)",
    )
    p.add_argument("--subset", default="valid")
    p.add_argument(
        "--width", type=int, default=512, help="embedding width (ffn 4x, one head per 64)"
    )
    p.add_argument("--sentences", type=int, default=48)
    p.add_argument(
        "--updates",
        type=int,
        default=0,
        help="part 2: train each model this many updates (0: skip)",
    )
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=4000)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument(
        "--untied", action="store_true", help="part 2 with untied output embeddings (default: tied)"
    )
    p.add_argument(
        "--skip-init", action="store_true", help="leave out part 1 (the loss at initialisation)"
    )
    p.add_argument("--out", default="bench_runs/dlcl_init_loss")
    add_device_argument(p)
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    device = device_from_args(args)
    os.makedirs(args.out, exist_ok=True)
    result = dict(width=args.width, init=[] if args.skip_init else at_initialisation(args, device))
    lines = (
        []
        if args.skip_init
        else [
            f"width {args.width}, {args.sentences} {args.subset} sentences, at initialisation (training mode)",
            "",
            harness.markdown_table(
                [
                    "model",
                    "output embeddings",
                    "loss (nll, bits)",
                    "logit of the fed token",
                    "argmax = fed token",
                ],
                [
                    [
                        r["model"],
                        "tied" if r["tied"] else "untied",
                        f"{r['nll_bits']:.2f}",
                        f"{r['fed_token_logit']:.1f}",
                        f"{r['argmax_is_fed_token']:.0%}",
                    ]
                    for r in result["init"]
                ],
                "llrrr",
            ),
        ]
    )
    if args.updates:
        curves = {
            arch: train_losses(args, arch, os.path.join(args.out, arch))
            for arch in ("transformer_prenorm", "transformer_dlcl")
        }
        result["train"] = curves
        pre, dlcl = curves["transformer_prenorm"], curves["transformer_dlcl"]
        lines += [
            "",
            f"fairseq-train, {'untied' if args.untied else 'tied'} embeddings, lr {args.lr}, warm-up {args.warmup}, "
            f"{args.max_tokens} tokens per batch (label-smoothed loss, bits)",
            "",
            harness.markdown_table(
                ["update", "pre-norm", "DLCL", "DLCL - pre-norm"],
                [
                    [u, f"{pre[u]:.2f}", f"{dlcl[u]:.2f}", f"{dlcl[u] - pre[u]:+.2f}"]
                    for u in sorted(pre)
                    if u in dlcl
                ],
                "rrrr",
            ),
        ]
    harness.write_json(os.path.join(args.out, "results.json"), result)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
