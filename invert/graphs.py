"""Capturing a step as one CUDA graph, or falling back to running it eagerly.

The inversion engine (:mod:`invert.engine`) and the training step (:mod:`training.step`) both record one function
over static buffers and replay it; both refuse a failed capture with its likely cause under a strict setting, and
otherwise log it and carry on eagerly. That decision lives here once.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

logger = logging.getLogger(__name__)


def capture_cuda_graph(
    step: Callable[[], None],
    *,
    device: torch.device,
    strict: bool,
    what: str,
    suspect: str,
    fix: str,
    warm_up: Optional[Callable[[], None]] = None,
) -> Optional[Callable[[], None]]:
    """``step()`` captured as one CUDA graph on ``device``: returns a ``replay`` (on that device, whichever is current),
    or None where capture failed and ``strict`` is off (the caller then runs ``step`` eagerly).

    ``warm_up`` runs first. Its steps are eager, so an error there is the step's own and is raised as it is, as is
    running out of memory under ``strict`` (without ``strict`` that falls back). With ``strict`` any other failure of
    the capture raises a ``RuntimeError`` naming ``what`` was captured, the ``suspect`` that probably synchronises with
    the host, and the setting that avoids capture (``fix``).
    """
    # torch.cuda.graph's default stream belongs to whichever device was current when it was first made: the capture,
    # its stream and each replay are put on ``device`` (a run on cuda:1 otherwise captured an empty graph).
    with torch.cuda.device(device):
        warmed_up = False
        try:
            if warm_up is not None:
                warm_up()
            warmed_up = True
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
                step()
        except torch.cuda.OutOfMemoryError as err:  # not a host sync: the warm-up's copy or the graph's pool needs more memory
            if strict:
                raise
            return _fall_back(what, f"out of memory: {err}", device)
        except RuntimeError as err:
            if not warmed_up:
                raise
            if strict:
                raise RuntimeError(
                    f"capturing {what} as a CUDA graph failed ({err}); {suspect} probably synchronises with the host (.item(), "
                    f"a data-dependent shape, a check outside invert.validation.hot_loop()). {fix}"
                ) from err
            return _fall_back(what, str(err), device)

    def replay() -> None:
        with torch.cuda.device(device):
            graph.replay()

    return replay


def _fall_back(what: str, cause: str, device: torch.device) -> None:
    logger.warning("CUDA graph capture of %s failed (%s); running it eagerly", what, cause)
    torch.cuda.synchronize(device)
    return None


__all__ = ["capture_cuda_graph"]
