"""``python -m training.convert SRC DST --arch NAME --dataset NAME [--kwarg KEY=VALUE ...]``: any checkpoint → a clean
safetensors file.

Reads a state dict, torchvision weights, a ``robustness``-library checkpoint or safetensors
(:func:`training.checkpoints.read_checkpoint`), checks that it fits the zoo architecture, and writes the
classifier's weights (normalisation included) with :func:`training.checkpoints.save_checkpoint`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from .checkpoints import CheckpointError, save_checkpoint
from .models import IMAGENET_LIKE, build_model


def convert(src: str | Path, dst: str | Path, arch: str, dataset: str, trust_pickle: bool = False, overwrite: bool = False,
            **build_kwargs) -> Path:
    """Read ``src`` in any supported format, check it fits ``arch`` on ``dataset``, write safetensors to ``dst``. A file
    without its input normalisation needs ``mean=``/``std=`` (except on ImageNet, whose torchvision weights expect its
    statistics): the written file states one, so a guess would no longer be warned about when it is loaded. An existing
    ``dst`` is replaced only with ``overwrite`` (it replaced any file, a text file too, without a word)."""
    if Path(dst).is_dir():
        raise ValueError(f"{dst} is a folder: give the file to write, e.g. {Path(dst) / (Path(src).stem + '.safetensors')}")
    if Path(dst).exists() and not overwrite:
        raise FileExistsError(f"{dst} exists: give another destination, or replace it with --overwrite (overwrite=True)")
    model = build_model(arch, dataset, checkpoint=str(src), trust_pickle=trust_pickle, **build_kwargs)
    guessed = not getattr(model, "normalization_from_checkpoint", True) and "mean" not in build_kwargs and "std" not in build_kwargs
    if guessed and dataset not in IMAGENET_LIKE:  # written into the new file, the guess would pass for the weights' own
        raise ValueError(f"{src} holds no input normalisation, and the file written would carry {dataset}'s statistics as if they were "
                         "its own: pass the normalisation the weights were trained with, --kwarg 'mean=[0,0,0]' --kwarg 'std=[1,1,1]' "
                         "for raw [0, 1] inputs (TRADES, MART and k-WTA reference code), or the data set's mean and std")
    return save_checkpoint(model, dst, {"converted_from": str(src)})  # the builder arguments go in as kwarg.<name>


def _kwarg(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. width=16), got {text!r}")
    return key, yaml.safe_load(value)  # 16 -> int, 0.1 -> float, true -> bool, as on Hydra's command line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.convert",
        description="Convert a checkpoint (state dict, torchvision weights, robustness checkpoint, safetensors) "
        "into a clean safetensors file for a zoo architecture.",
    )
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--arch", required=True, help="zoo architecture, e.g. resnet18")
    parser.add_argument("--dataset", default="cifar10", help="data set the model was trained on (default cifar10)")
    parser.add_argument("--num-classes", type=int, default=None)
    parser.add_argument("--trust-pickle", action="store_true", help="allow pickles that can run code (only for files you trust)")
    parser.add_argument("--overwrite", action="store_true", help="replace dst if it exists")
    parser.add_argument("--kwarg", type=_kwarg, action="append", default=[], metavar="KEY=VALUE",
                        help="an architecture argument, repeatable (e.g. --kwarg width=16 --kwarg ratio=0.1)")
    args = parser.parse_args(argv)
    try:
        out = convert(args.src, args.dst, args.arch, args.dataset, trust_pickle=args.trust_pickle, overwrite=args.overwrite,
                      num_classes=args.num_classes, **dict(args.kwarg))
    except (CheckpointError, FileNotFoundError, FileExistsError, ValueError) as err:
        sys.exit(f"error: {str(err).replace('+model.kwargs.', '--kwarg ')}")  # the hint in this command's own syntax
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
