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
    usage = f"usage: python -m perceptual {{{', '.join(COMMANDS)}}} [key=value ...]\n{__doc__}"
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage)  # asked for: status 0
        return
    if not argv or argv[0] not in COMMANDS:
        sys.exit((f"unknown command {argv[0]!r}\n" if argv else "") + usage)
    module_name = COMMANDS[argv[0]]
    from training.config import run_checked
    from training.io import exit_on_sigterm

    exit_on_sigterm()  # a killed job (timeout, scancel) removes its staging folders as Ctrl-C does
    run_checked(argv[0], argv[1:])  # a misspelt key is refused by name before any work starts
    # Hydra reads sys.argv: hand it the overrides only.
    sys.argv = [f"{sys.argv[0]} {argv[0]}"] + argv[1:]
    importlib.import_module(module_name).main()


if __name__ == "__main__":
    main()
