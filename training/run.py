"""The run directory of a training run: config, per-epoch metrics, checkpoints, summary.

Layout::

    RUN_DIR/
      config.yaml                    the resolved config the run started with
      metrics.jsonl                  one JSON line per epoch
      checkpoints/
        epoch_0007/model.safetensors the classifier's weights (loadable with build_model(..., checkpoint=))
        epoch_0007/state.pt          optimizer, scheduler, RNG states, epoch, recipe state (torch.save;
                                     read back with torch.load(weights_only=True))
        latest.json                  {"epoch": 7, "path": "epoch_0007"}: the commit point
      model.safetensors              the final classifier (after SimCLR's linear probe)
      summary.json                   clean / robust accuracy, time, images/s

Every file is written atomically (``training.io``). A checkpoint becomes the one resumed from only
when ``latest.json`` is replaced after both of its files exist, so a crash mid-save leaves the
previous checkpoint in charge; older checkpoint folders are deleted afterwards (``keep``).

One process trains in a run directory at a time (:meth:`RunDirectory.held`, an advisory lock on
``RUN_DIR/.lock``): two jobs of a sweep that need the same model (``reproduce``'s Table 1 and Fig. 6 share
their standard and PGD runs) would otherwise both train it, appending each epoch to the metrics twice and
resuming from each other's checkpoints.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from .checkpoints import save_checkpoint
from .io import LockBusyError, append_jsonl, atomic_save, atomic_write_json, atomic_write_text, exclusive_lock

STATE_FORMAT = 1

logger = logging.getLogger(__name__)


class RunDirectoryError(RuntimeError):
    """The run directory cannot be used as asked (it holds another run, or its checkpoint is unreadable)."""


@dataclass(frozen=True)
class CheckpointRef:
    epoch: int
    weights: Path
    state: Path


class RunDirectory:
    """Reads and writes one run's directory (see module docstring). Only rank 0 should write."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.config_path = self.path / "config.yaml"
        self.metrics_path = self.path / "metrics.jsonl"
        self.checkpoint_dir = self.path / "checkpoints"
        self.latest_path = self.checkpoint_dir / "latest.json"
        self.model_path = self.path / "model.safetensors"
        self.summary_path = self.path / "summary.json"

    # one process at a time -------------------------------------------------------------------------
    @contextlib.contextmanager
    def held(self, wait: bool = True, poll_s: float = 2.0) -> Iterator[None]:
        """Hold the run directory for this process while training in it (:func:`~training.io.exclusive_lock` on
        ``RUN_DIR/.lock``). Another process training here makes this wait for it (``wait``; the waiter then finds the run
        complete and reuses it, or resumes it) or raise :class:`RunDirectoryError` naming the holder."""
        try:
            with exclusive_lock(self.path / ".lock", what=str(self.path), activity="being trained", wait=wait, poll_s=poll_s):
                yield
        except LockBusyError as busy:
            raise RunDirectoryError(f"{self.path} is being trained by another process ({busy.holder}); wait for it to finish "
                                    "and run again (a finished run is reused), or choose another run_dir") from None

    # config -----------------------------------------------------------------------------------------
    def write_config(self, yaml_text: str) -> None:
        atomic_write_text(self.config_path, yaml_text)

    def read_config_text(self) -> str | None:
        return self.config_path.read_text(encoding="utf-8") if self.config_path.is_file() else None

    def remove_stale_temporaries(self) -> list[Path]:
        """Delete the temporary files and staging folders (``.<name>.*.tmp``, :mod:`training.io`) that a killed process
        left in the run folder (SIGKILL skips every cleanup; a kill inside a checkpoint's write left up to a whole
        ``state.pt`` beside it for good). Only while holding the run's lock, when no other process can be writing them."""
        stale = sorted(self.path.rglob(".*.tmp")) if self.path.is_dir() else []
        for path in stale:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        if stale:
            logger.info("removed %d temporary file(s) a killed run left in %s", len(stale), self.path)
        return stale

    # metrics ----------------------------------------------------------------------------------------
    def log_metrics(self, record: Mapping[str, Any]) -> None:
        append_jsonl(self.metrics_path, dict(record))

    def read_metrics(self) -> list[dict]:
        if not self.metrics_path.is_file():
            return []
        records = []
        for line in self.metrics_path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a crash: everything after it is unreliable
                break
        return records

    def truncate_metrics(self, last_epoch: int, history: Sequence[Mapping[str, Any]] = ()) -> None:
        """Keep only the records of epochs up to ``last_epoch`` (the epoch a resume continues after):
        a crash after logging an epoch but before its checkpoint must not leave a duplicate line. An epoch the file
        lost (a line cut by a partial write ends the readable part) is written back from ``history``, the checkpoint's
        per-epoch numbers, with a warning."""
        kept = {int(r.get("epoch", 0)): r for r in self.read_metrics() if int(r.get("epoch", 0)) <= last_epoch}
        lost = sorted(int(h["epoch"]) for h in history if "epoch" in h and int(h["epoch"]) <= last_epoch and int(h["epoch"]) not in kept)
        if lost:
            logger.warning("%s had lost the records of epochs %s (a line cut by a partial write): written back from the checkpoint's "
                           "history (its numbers only)", self.metrics_path, lost)
            kept.update({int(h["epoch"]): dict(h) for h in history if int(h.get("epoch", 0)) in lost})
        atomic_write_text(self.metrics_path, "".join(json.dumps(kept[epoch]) + "\n" for epoch in sorted(kept)))

    # checkpoints ------------------------------------------------------------------------------------
    def latest(self) -> CheckpointRef | None:
        """The committed checkpoint, or None; raises if ``latest.json`` points at missing files."""
        if not self.latest_path.is_file():
            return None
        try:
            pointer = json.loads(self.latest_path.read_text(encoding="utf-8"))
            folder = self.checkpoint_dir / pointer["path"]
            ref = CheckpointRef(int(pointer["epoch"]), folder / "model.safetensors", folder / "state.pt")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise RunDirectoryError(f"{self.latest_path} is unreadable ({err}){self.resume_hint(None)}") from err
        if not (ref.weights.is_file() and ref.state.is_file()):
            raise RunDirectoryError(f"{self.latest_path} points at {folder}, which lacks model.safetensors or state.pt{self.resume_hint(ref)}")
        return ref

    def earlier_checkpoint(self, ref: CheckpointRef | None) -> CheckpointRef | None:
        """The newest kept checkpoint before ``ref`` (of all, for None) with both of its files: the way back when ``ref``'s
        are damaged, or when ``latest.json`` is."""
        for epoch, folder in reversed(self._checkpoint_folders()):
            if (ref is None or epoch < ref.epoch) and (folder / "model.safetensors").is_file() and (folder / "state.pt").is_file():
                return CheckpointRef(epoch, folder / "model.safetensors", folder / "state.pt")
        return None

    def _checkpoint_folders(self) -> list[tuple[int, Path]]:
        """(epoch, folder) of every ``epoch_<n>`` folder, oldest first: by number, as epoch_10000 sorts before epoch_9999 by name."""
        found = [(folder.name.removeprefix("epoch_"), folder) for folder in self.checkpoint_dir.glob("epoch_*") if folder.is_dir()]
        return sorted((int(epoch), folder) for epoch, folder in found if epoch.isdigit())

    def resume_hint(self, ref: CheckpointRef | None) -> str:
        """What to do when the checkpoint ``ref`` (None: the pointer to the latest) cannot be read: go back to an earlier
        one, or start afresh."""
        earlier = self.earlier_checkpoint(ref)
        if earlier is None:
            return f"; no {'earlier ' if ref else ''}checkpoint is kept: delete {self.path} (or choose another run_dir) to start afresh"
        return (f"; the checkpoint of epoch {earlier.epoch} is kept{' beside it' if ref else ''}: resume from it by writing "
                f"'{json.dumps({'epoch': earlier.epoch, 'path': earlier.weights.parent.name})}' to {self.latest_path}")

    def save_checkpoint(self, epoch: int, model: nn.Module, state: Mapping[str, Any], metadata: Mapping[str, Any] | None = None,
                        keep: int = 2) -> CheckpointRef:
        """Write weights and state for ``epoch``, commit them, then delete all but the ``keep`` newest (0 keeps all)."""
        name = f"epoch_{epoch:04d}"
        folder = self.checkpoint_dir / name
        save_checkpoint(model, folder / "model.safetensors", {"epoch": epoch, **(metadata or {})})
        atomic_save(folder / "state.pt", lambda tmp: torch.save({"format": STATE_FORMAT, **state}, tmp))
        atomic_write_json(self.latest_path, {"epoch": epoch, "path": name})
        if keep > 0:
            for _, old in self._checkpoint_folders()[:-keep]:
                if old.name != name:
                    shutil.rmtree(old, ignore_errors=True)
        return CheckpointRef(epoch, folder / "model.safetensors", folder / "state.pt")

    @staticmethod
    def load_state(ref: CheckpointRef) -> dict[str, Any]:
        """The training state, loaded safely (``weights_only=True``: tensors and plain containers only)."""
        try:
            state = torch.load(ref.state, map_location="cpu", weights_only=True)
        except Exception as err:  # corrupt files raise many types
            raise RunDirectoryError(f"cannot read training state {ref.state}: {err}") from err
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise RunDirectoryError(f"{ref.state} is not a training state of format {STATE_FORMAT}")
        return state

    # results ----------------------------------------------------------------------------------------
    def save_model(self, model: nn.Module, metadata: Mapping[str, Any] | None = None) -> Path:
        return save_checkpoint(model, self.model_path, metadata)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        atomic_write_json(self.summary_path, dict(summary))

    def read_summary(self) -> dict | None:
        return json.loads(self.summary_path.read_text(encoding="utf-8")) if self.summary_path.is_file() else None


__all__ = ["CheckpointRef", "RunDirectory", "RunDirectoryError", "STATE_FORMAT"]
