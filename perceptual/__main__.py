"""``python -m perceptual <command> [hydra overrides]``: the commands of :mod:`perceptual.pipelines`.

``measure`` (observer alignment of models, the paper's Table 1), ``demo`` (the main job on the embedded
digits, offline), ``compare`` (models vs the observer panel under distortion conditions, the metric suite),
``humans-mvh`` (the model-vs-human benchmark's real human trials); :data:`perceptual.pipelines.COMMANDS`
lists every command.
"""
from __future__ import annotations

import importlib
import sys

from .pipelines import COMMANDS


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(COMMANDS)
        sys.exit(f"usage: python -m perceptual {{{names}}} [key=value ...]\n{__doc__}")
    module_name = COMMANDS[argv[0]]
    from training.config import run_checked

    run_checked(argv[0], argv[1:])  # a misspelt key is refused by name before any work starts
    # Hydra reads sys.argv: hand it the overrides only.
    sys.argv = [f"{sys.argv[0]} {argv[0]}"] + argv[1:]
    importlib.import_module(module_name).main()


if __name__ == "__main__":
    main()
