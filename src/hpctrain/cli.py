"""Command line: `make-data` and `train`. Everything is validated before torch is imported."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hpctrain import EXIT_OK, EXIT_REQUEUE, EXIT_USAGE, HpctrainError, config
from hpctrain.signals import JobSignals

DESCRIPTION = """\
Train an image classifier; made for clusters: checkpoints every epoch, resumes from the newest
valid checkpoint, and on SIGUSR1/SIGTERM checkpoints at once and exits 75 (requeue me).
SIGUSR2 writes a checkpoint and carries on."""

TRAIN_EPILOG = f"""\
Every option can also come from the environment variable named in brackets; a flag wins over
the environment, which wins over the default.

Exit codes: {EXIT_OK} done; {EXIT_REQUEUE} checkpointed on SIGUSR1/SIGTERM, resubmit to continue;
{EXIT_USAGE} bad input (nothing trained); 1 crash.
Output: OUTPUT_DIR/metrics.jsonl (one JSON object per line, also on stdout),
OUTPUT_DIR/tensorboard/events.out.tfevents.* (the curves, one step axis across resumes),
OUTPUT_DIR/checkpoints/ckpt-eEEEE-sSSSSSS.pt, OUTPUT_DIR/gpu-<host>.csv (CUDA + nvidia-smi).
Several processes (DDP): torchrun --nproc-per-node N -m hpctrain train ...; with a PyTorch built
without libuv (Debian's), use python -m hpctrain.torchrun in place of torchrun (same arguments)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hpctrain", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    make_data = commands.add_parser(
        "make-data",
        help="write the handwritten-digits dataset as one archive of shards",
        description="Write scikit-learn's bundled handwritten digits (no download) as ONE .tar of NumPy "
        "shards plus manifest.json. Extract it on node-local scratch and pass that directory as --data-dir.",
    )
    make_data.add_argument("--out", type=Path, required=True, metavar="FILE.tar", help="archive to write")
    make_data.add_argument("--shard-size", type=int, default=512, help="images per shard (default 512)")
    make_data.add_argument("--val-fraction", type=float, default=0.2, help="held-out share (default 0.2)")
    make_data.add_argument("--force", action="store_true", help="replace an existing archive")

    train = commands.add_parser(
        "train",
        help="train (or resume training) a model",
        description=DESCRIPTION,
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for option in config.OPTIONS:
        default = "see above" if option.default is None else option.default
        choices = f" {{{','.join(option.choices)}}}" if option.choices else ""
        train.add_argument(
            option.flag,
            dest=option.name,
            metavar=option.env if not option.choices else None,
            choices=None,  # checked in config.resolve, which also covers the environment variable
            help=f"{option.help}{choices} [{option.env}; default: {default}]".replace("%", "%%"),
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "make-data":
            from hpctrain.makedata import write_digits_archive

            record = write_digits_archive(args.out, args.shard_size, args.val_fraction, args.force)
            counts = ", ".join(f"{split} {info['count']}" for split, info in record["splits"].items())
            print(f"wrote {args.out}: {record['name']} ({counts} images)")
            return EXIT_OK

        from hpctrain import checkpoint, shards

        cfg = config.resolve(vars(args), os.environ)
        manifest = shards.read_manifest(cfg.data_dir)
        checkpoint.prepare_dir(cfg.checkpoint_dir)

        # Before the slow torch import: a signal during start-up is then acted on at the first step.
        signals = JobSignals().install()
        from hpctrain import train  # imports torch: only now that the input is known to be good

        return train.run(cfg, manifest, signals)
    except HpctrainError as exc:
        hint = f" ({exc.hint})" if exc.hint else ""
        print(f"hpctrain: error: {exc.message}{hint}", file=sys.stderr)
        return EXIT_USAGE
