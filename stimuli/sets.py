"""The stimulus-set format: a directory of 8-bit PNGs, exact float tensors and a JSON manifest.

Layout of a set at ``PATH``::

    PATH/manifest.json          written LAST: its presence means the set is complete
    PATH/tensors.safetensors    "images" float32 (N, C, H, W) in manifest row order (exact values);
                                "loss_curve" float32 (N, P), each result's best loss so far at the
                                manifest's ``curve_steps`` (NaN on rows that are not results)
    PATH/images/<id>.png        8-bit RGB (or L for 1 channel): uint8 = round(clamp(x, 0, 1) * 255),
                                round half to even (torch.round), what people and the observer see
    PATH/preview.png            a grid of target / seed / result (like Nanda et al.'s Figure 1)
    PATH/parts/                 only while a run is unfinished (see :mod:`stimuli.generate`)

``manifest.json`` holds the format name and version, the set's kind, the PNG quantisation, the
SHA-256 of the tensors file and of every PNG, the parameters that determine the set and their
fingerprint, the config that made it, the shard it is (null for a complete set) and one row per
image (:data:`COLUMNS`; a result's ``final_loss`` is the engine's whole objective at its image, ``final_task_loss``
the set's objective alone, without the engine's priors and transformation robustness: for an inversion, the normalised
representation distance; sets made before it have no such column). :func:`load_set` verifies all of it and refuses a set that is partial or
corrupted, with a message that says what to do.

Every file is written atomically (temporary file + rename, :mod:`training.io`).
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from invert import check_images
from training.io import atomic_save, atomic_write_bytes, atomic_write_json

logger = logging.getLogger(__name__)

FORMAT_NAME = "repalign-stimulus-set"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TENSORS = "tensors.safetensors"
IMAGES_DIR = "images"
PREVIEW = "preview.png"
PARTS_DIR = "parts"
TRIALS_DIR = "trials"  # `python -m stimuli trials` writes a set's trial tables here by default
QUANTISATION = "uint8 = round(clamp(x, 0, 1) * 255), round half to even (torch.round)"
ROLES = ("target", "seed", "result", "origin", "option", "query")

# One row per image. Links (target_id, seed_id, origin_id) are ids of other rows of the set.
STRING_COLUMNS = (
    "id", "role", "target_id", "seed_id", "origin_id", "seed_type", "direction", "class_name",
    "source", "source_split", "model", "layer", "checkpoint", "pushed_model", "pushed_layer",
    "pushed_checkpoint", "objective", "png",
)
INT_COLUMNS = ("position", "restart", "label", "source_index", "steps_used")
FLOAT_COLUMNS = ("initial_loss", "final_loss", "final_task_loss", "last_loss")
DICT_COLUMNS = ("objective_params",)
COLUMNS = [
    "id", "position", "role", "target_id", "seed_id", "origin_id", "seed_type", "direction", "restart",
    "label", "class_name", "source", "source_split", "source_index",
    "model", "layer", "checkpoint", "pushed_model", "pushed_layer", "pushed_checkpoint",
    "objective", "objective_params", "steps_used", "initial_loss", "final_loss", "final_task_loss", "last_loss", "png",
]
LINK_COLUMNS = ("target_id", "seed_id", "origin_id")
_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class StimulusSetError(ValueError):
    """A stimulus set on disk is missing, corrupted or not what was asked for."""


class IncompleteSetError(StimulusSetError):
    """A stimulus set whose generation has not finished (or a shard of one)."""


@dataclass
class StimulusSet:
    """A loaded stimulus set. ``images[i]`` and ``loss_curve[i]`` belong to ``manifest.iloc[i]``.

    kind: ``inversion``, ``controversial``, ``class_controversial`` (or a caller's own kind).
    parameters: what determines the images (targets, seeds, models, objective, engine);
    fingerprint: a hash of ``parameters``; config: the config that made the set; shard: None for a
    complete set, else ``{"index", "count", "n_images"}``.
    """

    path: Path | None
    kind: str
    images: Tensor
    manifest: pd.DataFrame
    loss_curve: Tensor
    curve_steps: list[int] = field(default_factory=list)
    parameters: dict = field(default_factory=dict)
    fingerprint: str | None = None
    config: dict = field(default_factory=dict)
    shard: dict | None = None

    def __len__(self) -> int:
        return len(self.manifest)

    @property
    def ids(self) -> list[str]:
        return list(self.manifest["id"])

    def index_of(self, ids: Iterable[str]) -> list[int]:
        """Row numbers of ``ids`` (KeyError naming the first unknown id)."""
        positions = {image_id: i for i, image_id in enumerate(self.manifest["id"])}
        out = []
        for image_id in ids:
            if image_id not in positions:
                raise KeyError(f"no image {image_id!r} in the set")
            out.append(positions[image_id])
        return out

    def get(self, ids: Iterable[str] | str) -> Tensor:
        """The float images of ``ids`` (one id gives one (C, H, W) image)."""
        if isinstance(ids, str):
            return self.images[self.index_of([ids])[0]]
        return self.images[self.index_of(ids)]

    def role(self, role: str) -> tuple[pd.DataFrame, Tensor]:
        """(manifest rows, images) of one role, in manifest order."""
        mask = (self.manifest["role"] == role).to_numpy(dtype=bool)
        return self.manifest[mask].reset_index(drop=True), self.images[torch.tensor(mask)]

    def write(self, path: str | Path, preview: bool = True) -> Path:
        """Write this set to ``path`` (a round trip: :func:`load_set` gives it back equal)."""
        return write_set(
            path, self.images, self.manifest, kind=self.kind, parameters=self.parameters, config=self.config,
            fingerprint=self.fingerprint, curve_steps=self.curve_steps, loss_curve=self.loss_curve, shard=self.shard,
            preview=preview,
        )


# ---------------------------------------------------------------------------------------- helpers


def quantise(images: Tensor) -> Tensor:
    """[0, 1] float images → uint8 as the PNGs store them: round(clamp(x, 0, 1) * 255)."""
    return images.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_sha256(tensor: Tensor) -> str:
    """A short content hash of a tensor's values (its bytes in memory order; dtype and shape are the caller's to record)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().data).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def canonical_json(obj: Any) -> str:
    """Key-sorted compact JSON: the input of fingerprints."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_plain)


def fingerprint_of(parameters: Mapping[str, Any]) -> str:
    return sha256_bytes(canonical_json(parameters).encode())[:16]


def _plain(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def png_bytes(image_uint8: Tensor) -> bytes:
    """PNG encoding of one uint8 (C, H, W) image (C = 1 or 3). PIL writes no timestamps, so the same
    pixels always give the same bytes."""
    from PIL import Image

    array = image_uint8.permute(1, 2, 0).contiguous().numpy()
    if array.shape[2] == 1:
        pil = Image.fromarray(array[:, :, 0], mode="L")
    elif array.shape[2] == 3:
        pil = Image.fromarray(array, mode="RGB")
    else:
        raise ValueError(f"PNGs hold 1 or 3 channels, the images have {array.shape[2]}")
    buffer = io.BytesIO()
    pil.save(buffer, format="PNG")
    return buffer.getvalue()


def read_png(path: str | Path) -> Tensor:
    """A set's PNG as uint8 (C, H, W)."""
    from PIL import Image

    with Image.open(path) as pil:
        array = np.asarray(pil)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def _cell(value: Any, column: str) -> Any:
    """One manifest cell as a plain JSON value (None for missing), by column type."""
    if value is None:
        return None
    if column in DICT_COLUMNS:
        if isinstance(value, float) and math.isnan(value):
            return None
        return json.loads(canonical_json(dict(value)))
    if isinstance(value, (dict, list)):
        return json.loads(canonical_json(value))
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):  # arrays and other non-scalars
        pass
    if column in INT_COLUMNS:
        return int(value)
    if column in FLOAT_COLUMNS:
        return float(value)
    if column in STRING_COLUMNS:
        return str(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def manifest_rows(manifest: pd.DataFrame) -> list[dict]:
    """The rows of a manifest table as plain dicts (known columns first, in :data:`COLUMNS` order)."""
    columns = [c for c in COLUMNS if c in manifest.columns] + [c for c in manifest.columns if c not in COLUMNS]
    return [{c: _cell(row[c], c) for c in columns} for row in manifest.to_dict("records")]


def manifest_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Manifest rows → DataFrame with stable dtypes: Int64 for integer columns (nullable), float64
    for losses, objects (None for missing) for strings and parameters."""
    if columns is None:
        extra = []
        for row in rows:
            extra.extend(c for c in row if c not in COLUMNS and c not in extra)
        columns = COLUMNS + extra
    data = {}
    for column in columns:
        values = [row.get(column) for row in rows]
        if column in INT_COLUMNS:
            data[column] = pd.array(values, dtype="Int64")
        elif column in FLOAT_COLUMNS:
            data[column] = pd.array([math.nan if v is None else float(v) for v in values], dtype="float64")
        else:  # object, not pandas' inferred str dtype: missing stays None, as in the JSON
            series = np.empty(len(values), dtype=object)
            series[:] = values
            data[column] = pd.Series(series, dtype=object)
    return pd.DataFrame(data, columns=list(columns))


# ---------------------------------------------------------------------------------------- writing


def _check_manifest(manifest: pd.DataFrame, n_images: int) -> None:
    missing = {"id", "role"} - set(manifest.columns)
    if missing:
        raise ValueError(f"the manifest lacks the columns {sorted(missing)}")
    if len(manifest) != n_images:
        raise ValueError(f"the manifest has {len(manifest)} rows but there are {n_images} images: one row per image")
    ids = list(manifest["id"])
    bad = [i for i in ids if not isinstance(i, str) or not _ID_PATTERN.match(i)]
    if bad:
        raise ValueError(f"image ids must be file-name safe (letters, digits, '.', '_', '-'), got {bad[:5]}")
    duplicates = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if duplicates:
        raise ValueError(f"image ids repeat: {duplicates[:5]}")
    unknown_roles = sorted(set(manifest["role"]) - set(ROLES))
    if unknown_roles:
        raise ValueError(f"unknown roles {unknown_roles}: use {ROLES}")
    known = set(ids)
    for column in LINK_COLUMNS:
        if column in manifest.columns:
            dangling = sorted({v for v in manifest[column] if isinstance(v, str) and v not in known})
            if dangling:
                raise ValueError(f"{column} links to ids that are not in the set: {dangling[:5]}")


def write_set(
    path: str | Path,
    images: Tensor,
    manifest: pd.DataFrame,
    *,
    kind: str,
    parameters: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    fingerprint: str | None = None,
    curve_steps: Sequence[int] = (),
    loss_curve: Tensor | None = None,
    shard: Mapping[str, Any] | None = None,
    preview: bool = True,
) -> Path:
    """Write a stimulus set to the directory ``path`` (see the module docstring for the layout).

    ``images``: float (N, C, H, W) in [0, 1], row i described by ``manifest.iloc[i]`` (columns
    ``id`` and ``role`` at least; :data:`COLUMNS` are the known ones, others are kept as given).
    The manifest is written last, so a crash leaves no set that :func:`load_set` would accept; an
    existing manifest is removed first, and PNGs of ids no longer in the set are deleted.
    """
    path = Path(path)
    check_images(images, "stimulus-set images")
    if images.shape[1] not in (1, 3):  # refused by png_bytes too, but only after an existing set's manifest is gone
        raise ValueError(f"stimulus-set images need 1 or 3 channels (PNGs hold grey or RGB), got {images.shape[1]}")
    images = images.detach().to("cpu", torch.float32).contiguous()
    _check_manifest(manifest, images.shape[0])
    n = images.shape[0]
    if loss_curve is None:
        loss_curve = torch.full((n, len(curve_steps)), math.nan)
    loss_curve = loss_curve.detach().to("cpu", torch.float32).contiguous()
    if loss_curve.shape != (n, len(curve_steps)):
        raise ValueError(f"loss_curve must be (N, len(curve_steps)) = {(n, len(curve_steps))}, got {tuple(loss_curve.shape)}")
    rows = manifest_rows(manifest)
    path.mkdir(parents=True, exist_ok=True)
    (path / MANIFEST).unlink(missing_ok=True)  # the directory is not a set while it is rewritten
    (path / PREVIEW).unlink(missing_ok=True)  # a figure of the old images must not stay beside the new set

    image_dir = path / IMAGES_DIR
    image_dir.mkdir(exist_ok=True)
    png_hashes = {}
    quantised = quantise(images)
    for row, pixels in zip(rows, quantised):
        data = png_bytes(pixels)
        row["png"] = f"{IMAGES_DIR}/{row['id']}.png"
        png_hashes[row["id"]] = sha256_bytes(data)
        atomic_write_bytes(path / row["png"], data)
    keep = {f"{image_id}.png" for image_id in png_hashes}
    for stale in image_dir.glob("*.png"):
        if stale.name not in keep:
            stale.unlink()

    from safetensors.torch import save_file

    tensors = {"images": images, "loss_curve": loss_curve}
    atomic_save(path / TENSORS, lambda tmp: save_file(tensors, str(tmp), metadata={"format": FORMAT_NAME}))
    parameters = dict(parameters or {})
    info = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "n_images": n,
        "image_shape": list(images.shape[1:]),
        "png": {"folder": IMAGES_DIR, "dtype": "uint8", "mode": "L" if images.shape[1] == 1 else "RGB", "quantisation": QUANTISATION},
        "tensors": {
            "file": TENSORS,
            "sha256": sha256_file(path / TENSORS),
            "images": "float32 (N, C, H, W) in [0, 1], manifest row order, exact values",
            "loss_curve": "float32 (N, len(curve_steps)): best loss so far per result row, NaN elsewhere",
        },
        "curve_steps": [int(s) for s in curve_steps],
        "fingerprint": fingerprint or fingerprint_of(parameters),
        "parameters": json.loads(canonical_json(parameters)),
        "config": json.loads(canonical_json(dict(config or {}))),
        "shard": dict(shard) if shard else None,
        "png_sha256": png_hashes,
        "columns": list(rows[0]) if rows else list(COLUMNS),
        "rows": rows,
    }
    if preview:
        from .preview import write_preview

        try:
            write_preview(path / PREVIEW, images, manifest_table(rows, info["columns"]), title=_preview_title(kind, path, parameters))
        except Exception as err:  # a figure must never cost the set
            import warnings

            warnings.warn(f"could not draw the preview figure: {err}", stacklevel=2)
    atomic_write_json(path / MANIFEST, info, indent=1)
    return path


def _preview_title(kind: str, path: Path, parameters: Mapping[str, Any] | None) -> str:
    """The preview's title: the set's kind, the model(s) it was made with (a run's folders are often all called ``set``)
    and its folder."""
    parameters = parameters or {}

    def described(model: Any) -> str | None:
        if not isinstance(model, Mapping) or not model.get("name"):
            return None
        return str(model["name"]) + (f" at {model['layer']}" if model.get("layer") else "")

    models = [described(parameters.get("model"))] + [described(m) for m in (parameters.get("models") or {}).values()]
    models = [m for m in models if m]
    return f"{kind}: {' vs '.join(models)} ({path.name})" if models else f"{kind}: {path.name}"


# ---------------------------------------------------------------------------------------- loading


def _unfinished_message(path: Path) -> str:
    parts = path / PARTS_DIR
    plan = parts / "plan.json"
    if plan.is_file():
        try:
            info = json.loads(plan.read_text())
            done = len(list(parts.glob("chunk-*.json")))
            total = info.get("n_chunks_in_shard", "?")
            return (
                f"{path} is an unfinished stimulus set ({done} of {total} chunks done, no {MANIFEST} yet): "
                "run the same command again to resume it (done chunks are kept)"
            )
        except (OSError, ValueError):
            pass
    return f"{path} is an unfinished stimulus set (no {MANIFEST} yet): run the same command again to resume it"


def read_manifest(path: str | Path) -> dict:
    """The parsed ``manifest.json`` of the set at ``path`` (refusing a missing or unreadable one)."""
    path = Path(path)
    if not path.exists():
        raise StimulusSetError(f"no stimulus set at {path}: the directory does not exist")
    if not path.is_dir():
        raise StimulusSetError(f"{path} is a file; a stimulus set is a directory with {MANIFEST}")
    file = path / MANIFEST
    if not file.is_file():
        if (path / PARTS_DIR).is_dir():
            raise IncompleteSetError(_unfinished_message(path))
        if any((path / "shards").glob("shard-*")):  # a sharded run not merged yet, or a merge that stopped
            raise IncompleteSetError(f"{path} holds the shards of a stimulus set, not merged yet: once every shard is done, run "
                                     f"python -m stimuli merge out={path}")
        raise StimulusSetError(f"{path} is not a stimulus set: {MANIFEST} is missing (was it written by stimuli.write_set?)")
    try:
        info = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StimulusSetError(
            f"{file} is not valid JSON ({err}): the manifest is corrupted; regenerate the set (rerun its command "
            "with overwrite=true) or restore it from a copy"
        ) from err
    if not isinstance(info, dict) or info.get("format") != FORMAT_NAME:
        raise StimulusSetError(f"{file} is not a {FORMAT_NAME} manifest")
    version = info.get("format_version")
    if version != FORMAT_VERSION:
        raise StimulusSetError(
            f"{path} has format version {version}, this toolkit reads version {FORMAT_VERSION}: regenerate the set "
            "or use the toolkit version that wrote it"
        )
    for key in ("kind", "n_images", "image_shape", "tensors", "rows", "columns", "png_sha256"):
        if key not in info:
            raise StimulusSetError(f"{file} lacks the key {key!r}: the manifest is corrupted; regenerate the set")
    # valid JSON of the wrong shape raised a bare KeyError or TypeError further on, naming no fix
    malformed = next((what for what, bad in (
        ("tensors (an object with file and sha256)", not isinstance(info["tensors"], dict) or not {"file", "sha256"} <= info["tensors"].keys()),
        ("rows (a list of objects with id and png)", not isinstance(info["rows"], list)
         or not all(isinstance(row, dict) and {"id", "png"} <= row.keys() for row in info["rows"])),
        ("columns (a list)", not isinstance(info["columns"], list)),
        ("png_sha256 (an object)", not isinstance(info["png_sha256"], dict)),
    ) if bad), None)
    if malformed:
        raise StimulusSetError(f"{file}: {malformed} is malformed: the manifest is corrupted; regenerate the set (rerun its command "
                               "with overwrite=true) or restore it from a copy")
    return info


def load_set(path: str | Path, *, allow_shard: bool = False, verify_pngs: bool = True) -> StimulusSet:
    """Load and verify the stimulus set at ``path``: tensors plus the manifest as a DataFrame.

    Refuses (:class:`StimulusSetError`, :class:`IncompleteSetError`) an unfinished run, a shard
    (unless ``allow_shard``: merge shards with :func:`stimuli.merge_sets`), a missing or modified
    file (SHA-256 against the manifest), a tensor whose shape does not match the manifest, and a
    manifest with broken links. ``verify_pngs=False`` skips hashing the PNGs (the tensors, not
    the PNGs, are what is returned).
    """
    path = Path(path)
    info = read_manifest(path)
    shard = info.get("shard")
    if shard and not allow_shard:
        raise IncompleteSetError(
            f"{path} is shard {shard.get('index')} of {shard.get('count')} of a stimulus set, not the whole set: "
            f"merge the shards first (python -m stimuli merge out=...), or pass allow_shard=True"
        )
    tensor_file = path / info["tensors"]["file"]
    if not tensor_file.is_file():
        raise StimulusSetError(f"{tensor_file} is missing: the set is incomplete; regenerate it (rerun with overwrite=true)")
    if sha256_file(tensor_file) != info["tensors"]["sha256"]:
        raise StimulusSetError(
            f"{tensor_file} does not match the SHA-256 in {MANIFEST}: the file was modified or truncated; "
            "regenerate the set (rerun with overwrite=true) or rerun merge"
        )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(tensor_file))
    except (SafetensorError, OSError, ValueError) as err:
        raise StimulusSetError(f"{tensor_file} cannot be read ({err}): regenerate the set") from err
    images = tensors.get("images")
    loss_curve = tensors.get("loss_curve")
    n = int(info["n_images"])
    expected = (n, *info["image_shape"])
    if images is None or tuple(images.shape) != expected:
        got = None if images is None else tuple(images.shape)
        raise StimulusSetError(f"{tensor_file}: images have shape {got}, the manifest says {expected}; regenerate the set")
    curve_steps = [int(s) for s in info.get("curve_steps", [])]
    if loss_curve is None or tuple(loss_curve.shape) != (n, len(curve_steps)):
        got = None if loss_curve is None else tuple(loss_curve.shape)
        raise StimulusSetError(f"{tensor_file}: loss_curve has shape {got}, expected {(n, len(curve_steps))}; regenerate the set")
    rows = info["rows"]
    if len(rows) != n:
        raise StimulusSetError(f"{path / MANIFEST} has {len(rows)} rows but n_images = {n}: the manifest is corrupted")
    manifest = manifest_table(rows, info["columns"])
    try:
        _check_manifest(manifest, n)
    except ValueError as err:
        raise StimulusSetError(f"{path / MANIFEST}: {err}; regenerate the set") from err
    for row in rows:
        png = path / row["png"]
        if not png.is_file():
            raise StimulusSetError(f"{png} is missing: the set is incomplete; regenerate it (rerun with overwrite=true)")
        if verify_pngs and sha256_file(png) != info["png_sha256"].get(row["id"]):
            raise StimulusSetError(f"{png} does not match the SHA-256 in {MANIFEST}: it was modified; regenerate the set")
    return StimulusSet(
        path=path,
        kind=info["kind"],
        images=images,
        manifest=manifest,
        loss_curve=loss_curve,
        curve_steps=curve_steps,
        parameters=info.get("parameters", {}),
        fingerprint=info.get("fingerprint"),
        config=info.get("config", {}),
        shard=shard,
    )


def is_complete_set(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def remove_set(path: str | Path, keep_parts: bool = False) -> None:
    """Delete what a stimulus set (complete or unfinished) consists of, with the trial tables made from it
    (``trials/``: they name its images), and the directory if it is then empty; other files are kept. Refuses a
    directory that holds other things and no set. ``keep_parts`` keeps ``parts/`` (a new set's, about to replace it)."""
    path = Path(path)
    if not path.exists():
        return
    ours = [MANIFEST, TENSORS, IMAGES_DIR, PREVIEW, *([] if keep_parts else [PARTS_DIR]), TRIALS_DIR]
    if not any((path / name).exists() for name in (MANIFEST, PARTS_DIR)):
        raise StimulusSetError(f"{path} exists and is not a stimulus set: refusing to delete it; choose another out")
    for name in ours:
        target = path / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    for tmp in path.glob(".*.tmp"):  # leftovers of interrupted atomic writes
        tmp.unlink()
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()


# ---------------------------------------------------------------------------------------- merging


def shard_path(out: str | Path, shard: int, n_shards: int) -> Path:
    """Where the command line puts shard ``shard`` of ``n_shards`` of the set ``out``."""
    return Path(out) / "shards" / f"shard-{shard:03d}-of-{n_shards:03d}"


def find_shards(out: str | Path) -> list[Path]:
    return sorted(p for p in (Path(out) / "shards").glob("shard-*-of-*") if p.is_dir())


def merge_sets(inputs: Sequence[str | Path], out: str | Path, *, overwrite: bool = False, preview: bool = True) -> StimulusSet:
    """Join the shards ``inputs`` of one run into the set an unsharded run writes, at ``out``.

    Every shard must be complete and come from the same run (same fingerprint, kind and config),
    all shards 0..k-1 must be present exactly once, and images shared between shards (targets and
    seeds) must be identical. Rows are ordered by ``position`` (their place in the complete set).
    ``overwrite`` replaces a set already at ``out``, and the trial tables in its ``trials/`` unless it is this very set;
    without it, the set these shards make is returned as it is, and another set is refused.
    """
    if not inputs:
        raise StimulusSetError("no shards to merge: pass the shard directories (or run the sharded commands first)")
    inputs = [Path(p) for p in inputs]
    shards = []
    for p in inputs:
        try:
            shards.append(load_set(p, allow_shard=True))
        except IncompleteSetError as err:
            raise IncompleteSetError(f"cannot merge: {err}") from err
    first = shards[0]
    for s in shards:
        if s.shard is None:
            raise StimulusSetError(f"{s.path} is a complete set, not a shard: nothing to merge")
        for attribute in ("fingerprint", "kind", "curve_steps"):
            if getattr(s, attribute) != getattr(first, attribute):
                differ = sorted(k for k in set(s.parameters) | set(first.parameters) if s.parameters.get(k) != first.parameters.get(k))
                raise StimulusSetError(
                    f"{s.path} and {first.path} come from different runs ({attribute} differs; parameters that differ: "
                    f"{differ}): merge only the shards of one run"
                )
        if tuple(s.images.shape[1:]) != tuple(first.images.shape[1:]):
            raise StimulusSetError(f"{s.path} has images of another shape than {first.path}")
        if s.config != first.config:  # e.g. another micro_batch on another machine: same images
            import warnings

            warnings.warn(f"{s.path} recorded another config than {first.path}; the merged set keeps the first one", stacklevel=2)
    counts = sorted({s.shard["count"] for s in shards})
    if len(counts) > 1:
        by_count = {c: [str(s.path) for s in shards if s.shard["count"] == c] for c in counts}
        raise StimulusSetError(
            f"the shards split the run in different numbers of parts ({by_count}): merge the shards of one split "
            "(shard-i-of-k with one k); remove or move the others"
        )
    count = first.shard["count"]
    indices = sorted(s.shard["index"] for s in shards)
    if indices != list(range(count)):
        missing = sorted(set(range(count)) - set(indices))
        repeated = sorted({i for i in indices if indices.count(i) > 1})
        raise StimulusSetError(
            f"the shards do not make a whole run of {count}: missing shards {missing}, repeated {repeated}; "
            "run the missing ones (shard=i n_shards=k) and merge all of them"
        )
    rows: dict[str, dict] = {}
    images: dict[str, Tensor] = {}
    curves: dict[str, Tensor] = {}
    for s in shards:
        for i, row in enumerate(manifest_rows(s.manifest)):
            image_id = row["id"]
            row.pop("png", None)
            if image_id in rows:
                if rows[image_id] != row or not torch.equal(images[image_id], s.images[i]):
                    raise StimulusSetError(f"image {image_id!r} differs between shards: the shards come from different runs")
                continue
            rows[image_id] = row
            images[image_id] = s.images[i]
            curves[image_id] = s.loss_curve[i]
    ordered = sorted(rows, key=lambda image_id: rows[image_id]["position"])
    total = first.shard.get("n_images")
    positions = [rows[i]["position"] for i in ordered]
    if total is not None and positions != list(range(total)):
        raise StimulusSetError(f"the merged shards hold {len(positions)} of the set's {total} images: a shard is missing rows")
    out = Path(out)
    if is_complete_set(out):
        try:
            held = read_manifest(out)
            same = held.get("fingerprint") == first.fingerprint and held.get("shard") is None
        except StimulusSetError:
            same = False
        if same and not overwrite:  # merged before (a requeued job's script runs its merge again), as invert reuses its set
            logger.info("%s already holds this merged set: nothing to do", out)
            return load_set(out)
        if not overwrite:
            raise StimulusSetError(f"{out} already holds another stimulus set: pass overwrite=true to replace it")
        if not same and (out / TRIALS_DIR).is_dir():  # they name the images of the set being replaced
            shutil.rmtree(out / TRIALS_DIR)
    elif (out / IMAGES_DIR).is_dir():  # not a set: write_set would delete its PNGs that are no image of this one
        foreign = sorted(p.name for p in (out / IMAGES_DIR).glob("*.png") if p.stem not in rows)
        if foreign:
            raise StimulusSetError(f"{out / IMAGES_DIR} holds {len(foreign)} PNG(s) that are no image of this set ({', '.join(foreign[:3])}"
                                   f"{', ...' if len(foreign) > 3 else ''}) and no stimulus set: merging would delete them; move them "
                                   "or choose another out")
    table = manifest_table([rows[i] for i in ordered], [c for c in first.manifest.columns])
    write_set(
        out, torch.stack([images[i] for i in ordered]), table, kind=first.kind, parameters=first.parameters,
        config=first.config, fingerprint=first.fingerprint, curve_steps=first.curve_steps,
        loss_curve=torch.stack([curves[i] for i in ordered]), shard=None, preview=preview,
    )
    return load_set(out)


__all__ = [
    "COLUMNS",
    "FORMAT_VERSION",
    "IncompleteSetError",
    "QUANTISATION",
    "StimulusSet",
    "StimulusSetError",
    "find_shards",
    "is_complete_set",
    "load_set",
    "manifest_rows",
    "manifest_table",
    "merge_sets",
    "quantise",
    "read_manifest",
    "read_png",
    "remove_set",
    "shard_path",
    "write_set",
]
