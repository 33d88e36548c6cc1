"""On-disk caching of pipeline stages: a result is reused only when it was made from the same inputs.

Each cached file records a ``key`` (a hash of everything that determines it); a file with another key,
or one that cannot be read, is recomputed. Writes are atomic, so an interrupted run never leaves a
torn file, and a rerun resumes from whatever finished.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import torch

from training.checkpoints import weights_hash
from training.io import atomic_save


def cache_key(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable ``parts`` (others by their ``str``)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def module_identity(model: torch.nn.Module, identity: Any = None) -> str:
    """What a cached result of ``model`` is keyed by: its weights, its repr (the structure and the settings its modules
    show, e.g. ``Quantise(levels=8)`` or a k-WTA ratio, which no state_dict holds) and ``identity``, what the caller
    knows besides (e.g. a factory's config, whose kwargs its repr need not show)."""
    return cache_key(weights_hash(model), repr(model), identity)


def cached_json(path: Path, key: str) -> dict | None:
    """The JSON object at ``path`` if it was written under ``key``, else None."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:  # truncated JSON, or bytes that are not UTF-8: recomputed, as any file that cannot be read
        return None
    return data if isinstance(data, dict) and data.get("key") == key else None


def cached_tensors(path: Path, key: str, compute: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Load ``path`` (safetensors) when it was made under ``key``, else compute, save atomically and return."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, safe_open, save_file

    if path.is_file():
        try:
            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("key") == key:
                    return load_file(str(path))
        except (SafetensorError, OSError):
            pass  # unreadable: recompute
    tensors = {name: t.detach().cpu().contiguous() for name, t in compute().items()}
    atomic_save(path, lambda tmp: save_file(tensors, str(tmp), metadata={"key": key}))
    return tensors
