"""Data sets as whole in-memory uint8 tensors, ready to be moved to the GPU in one copy.

In-memory sets (CIFAR-10, CIFAR-100, the embedded digits) return an :class:`ImageSet`: ``images``
is uint8 (N, 3, H, W), ``labels`` int64 (N,), plus class names. Large ImageNet-style folders are
read lazily through torchvision's ``ImageFolder`` with the standard test transform.

CIFAR is read straight from its python-pickle folder (``cifar-10-batches-py`` or
``cifar-100-python``), not through torchvision's class, so that subsets in the same layout (whose
checksums differ from the official files) load too. Downloading goes through torchvision and only
when asked for (``download=True``).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

# Per-channel statistics used by the normaliser inside each model. CIFAR-10's are the `robustness`
# library's, so its checkpoints see exactly the inputs they were trained on; robustness has no CIFAR-100, whose
# values are Nanda et al.'s (deep-learning-base ``dataset_metadata.py``). A checkpoint that carries its own wins.
DATASET_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    # Measured on the digits training split as built below (32x32, 3 identical channels).
    "digits": ((0.3052, 0.3052, 0.3052), (0.3236, 0.3236, 0.3236)),
}
NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "imagenet": 1000, "digits": 10}
IMAGE_SIZE = {"cifar10": 32, "cifar100": 32, "imagenet": 224, "digits": 32}
IN_MEMORY = ("cifar10", "cifar100", "digits")
SPLITS = ("train", "test")

_CIFAR_LAYOUT = {
    "cifar10": {
        "folder": "cifar-10-batches-py",
        "train": [f"data_batch_{i}" for i in range(1, 6)],
        "test": ["test_batch"],
        "meta": "batches.meta",
        "label_key": "labels",
        "names_key": "label_names",
        "url": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    },
    "cifar100": {
        "folder": "cifar-100-python",
        "train": ["train"],
        "test": ["test"],
        "meta": "meta",
        "label_key": "fine_labels",
        "names_key": "fine_label_names",
        "url": "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    },
}


class DataNotFoundError(FileNotFoundError):
    """A data set's files are not where they were looked for; the message says where to put them."""


@dataclass
class ImageSet:
    """A labelled image set held whole in memory.

    ``images``: uint8 (N, 3, H, W); ``labels``: int64 (N,); ``classes[k]`` names label k.
    """

    name: str
    split: str
    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4 or self.images.shape[1] != 3:
            raise ValueError(f"ImageSet images must be uint8 (N, 3, H, W), got {self.images.dtype} {tuple(self.images.shape)}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"ImageSet needs one label per image: {tuple(self.labels.shape)} vs {self.images.shape[0]} images")

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_size(self) -> int:
        return self.images.shape[-1]

    def float_images(self, index: torch.Tensor | Sequence[int] | slice | None = None, device=None) -> torch.Tensor:
        """Images as float32 in [0, 1] (optionally a subset, optionally moved to ``device``)."""
        images = self.images if index is None else self.images[index]
        return images.to(device=device, non_blocking=True).float().div_(255)

    def subset(self, index: torch.Tensor | Sequence[int]) -> "ImageSet":
        index = torch.as_tensor(index, dtype=torch.long)
        return ImageSet(self.name, self.split, self.images[index], self.labels[index], self.classes, dict(self.meta))

    def to(self, device) -> "ImageSet":
        """Move the whole set to ``device`` (one copy; augmentation then runs there)."""
        return ImageSet(self.name, self.split, self.images.to(device), self.labels.to(device), self.classes, dict(self.meta))


def dataset_stats(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel of a known data set."""
    _check_name(name, DATASET_STATS)
    return DATASET_STATS[name]


def load_dataset(name: str, split: str = "test", root: str | Path | None = None, download: bool = False) -> ImageSet:
    """Load an in-memory data set by name: ``cifar10``, ``cifar100`` (from ``root``) or ``digits`` (embedded)."""
    _check_name(name, IN_MEMORY, hint=" (ImageNet-style folders load lazily with load_image_folder)")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {SPLITS}")
    if name == "digits":
        return load_digits(split)
    return load_cifar(name, split, root=root, download=download)


def _check_name(name: str, known, hint: str = "") -> None:
    if name not in known:
        raise ValueError(f"unknown data set {name!r}: known are {sorted(known)}{hint}")


def find_cifar_folder(name: str, root: str | Path) -> Path | None:
    """The pickle folder under ``root`` (or ``root`` itself when it is that folder), if it exists."""
    layout = _CIFAR_LAYOUT[name]
    root = Path(root).expanduser()
    for candidate in (root / layout["folder"], root):
        if (candidate / layout["meta"]).is_file():
            return candidate
    return None


def _cifar_rows(data: np.ndarray, path: Path) -> np.ndarray:
    """CIFAR's layout, checked: one row of 3072 bytes per image (1024 red, 1024 green, 1024 blue, row-major), as
    (N, 3, 32, 32) uint8. torchvision's ``.data`` (N, 32, 32, 3) reshaped as rows would scramble every image, and
    floats cast to bytes would be truncated, so both are refused."""
    layout = "one row of 3072 integers in 0..255 per image (CIFAR's pickle layout: red, green, blue planes)"
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        hint = " (that is torchvision's HWC .data: write data.transpose(0, 3, 1, 2).reshape(N, 3072))" if data.shape[1:] == (32, 32, 3) else ""
        raise ValueError(f"{path}: 'data' has shape {data.shape}, expected {layout}{hint}")
    if not np.issubdtype(data.dtype, np.integer) or (data.size and (data.min() < 0 or data.max() > 255)):
        raise ValueError(f"{path}: 'data' holds {data.dtype} values in [{data.min()}, {data.max()}], expected {layout}")
    return data.astype(np.uint8).reshape(-1, 3, 32, 32)


def load_cifar(name: str = "cifar10", split: str = "test", root: str | Path | None = None, download: bool = False) -> ImageSet:
    """Read CIFAR-10/100 from its python-pickle folder into uint8 tensors.

    ``root`` is the directory that contains ``cifar-10-batches-py`` (or ``cifar-100-python``), or that
    folder itself. With ``download=True`` and the folder missing, torchvision downloads the official
    archive into ``root`` (network needed).
    """
    _check_name(name, _CIFAR_LAYOUT)
    layout = _CIFAR_LAYOUT[name]
    if root is None:
        raise DataNotFoundError(
            f"{name}: no data root given. Set data.root (command line: data.root=/path) to the directory that "
            f"contains '{layout['folder']}'."
        )
    folder = find_cifar_folder(name, root)
    if folder is None and download:
        import torchvision

        cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
        try:
            cls(str(root), train=split == "train", download=True)
        except Exception as err:  # network errors come in many types
            raise DataNotFoundError(
                f"{name}: download into {root} failed ({err}). Offline, fetch {layout['url']} elsewhere and "
                f"extract it so that {Path(root) / layout['folder']} exists."
            ) from err
        folder = find_cifar_folder(name, root)
    if folder is None:
        raise DataNotFoundError(
            f"{name} not found under {Path(root).expanduser()}: expected the folder '{layout['folder']}' with "
            f"{', '.join(layout['train'] + layout['test'] + [layout['meta']])}. Download {layout['url']} and extract "
            f"it there, or pass download=True (data.download=true) when online."
        )
    images, labels = [], []
    for file_name in layout[split]:
        batch = _cifar_entries(folder / file_name, ("data", layout["label_key"]))
        rows = _cifar_rows(np.asarray(batch["data"]), folder / file_name)
        file_labels = list(batch[layout["label_key"]])
        if len(file_labels) != len(rows):
            raise ValueError(f"{folder / file_name} holds {len(rows)} images but {len(file_labels)} {layout['label_key']}: one label per image")
        images.append(rows)
        labels.extend(file_labels)
    classes = list(_cifar_entries(folder / layout["meta"], (layout["names_key"],))[layout["names_key"]])
    outside = sorted({int(k) for k in labels if not 0 <= int(k) < len(classes)})
    if outside:
        raise ValueError(f"{folder}: labels {outside[:5]} lie outside the {len(classes)} classes of {layout['meta']}: corrupt or mixed files")
    return ImageSet(
        name=name,
        split=split,
        images=torch.from_numpy(np.concatenate(images)),
        labels=torch.tensor(labels, dtype=torch.long),
        classes=classes,
        meta={"root": str(folder)},
    )


def _cifar_entries(path: Path, keys: Sequence[str]) -> dict:
    """The dict a CIFAR file holds, with ``keys`` in it (a file of another layout is named, with what it holds)."""
    content = _read_pickle(path)
    missing = [key for key in keys if not isinstance(content, dict) or key not in content]
    if missing:
        holds = f"a dict with the keys {sorted(map(str, content))[:8]}" if isinstance(content, dict) else f"a {type(content).__name__}"
        raise ValueError(f"{path} holds {holds}, not CIFAR's layout: a dict with {', '.join(repr(k) for k in keys)} "
                         f"(missing {', '.join(repr(k) for k in missing)})")
    return content


class _RefusedGlobal(pickle.UnpicklingError):
    """A pickle names something no CIFAR file needs (and that could run code)."""


class _CifarUnpickler(pickle.Unpickler):
    """CIFAR's files are pickles of dicts, lists and numpy arrays: only numpy's array reconstruction may be named, so
    a crafted file cannot run code on loading (a plain ``pickle.load`` would call whatever it names)."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
               ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
               # protocol 5 (pickle.HIGHEST_PROTOCOL) stores arrays from a buffer; protocol 2 under Python 3 stores bytes so
               ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise _RefusedGlobal(f"it refers to {module}.{name}, which no CIFAR batch file does (not loaded: it could run code)")
        return super().find_class(module, name)


def _read_pickle(path: Path) -> dict:
    if not path.is_file():
        raise DataNotFoundError(f"missing file {path}: the CIFAR folder is incomplete; re-extract the archive there")
    try:
        with open(path, "rb") as f:
            return _CifarUnpickler(f, encoding="latin1").load()
    except _RefusedGlobal as err:
        raise ValueError(f"{path} is not a CIFAR batch file: {err}") from err
    except Exception as err:  # a corrupt pickle fails in many ways (MemoryError, OverflowError, KeyError ...)
        raise ValueError(f"{path} is not a readable CIFAR batch file (truncated or corrupt?): {type(err).__name__}: {err}; "
                         f"re-extract the archive into {path.parent.parent} (a partial download or copy leaves such files)") from err


DIGITS_SPLIT_SEED = 0
DIGITS_TEST_FRACTION = 0.25


def load_digits(split: str = "test", size: int = 32) -> ImageSet:
    """scikit-learn's handwritten digits (1,797 images, 10 classes) as 3-channel uint8 images.

    The 8x8 images (values 0-16) are scaled to [0, 1], resized bilinearly (antialiased) to
    ``size`` x ``size`` and repeated over three channels. The train/test split is fixed and
    stratified (seed 0, 25 % test: 1,347 train / 450 test images).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {SPLITS}")
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    index = np.arange(len(bunch.target))
    train_idx, test_idx = train_test_split(
        index, test_size=DIGITS_TEST_FRACTION, random_state=DIGITS_SPLIT_SEED, stratify=bunch.target
    )
    chosen = np.sort(train_idx if split == "train" else test_idx)
    small = torch.from_numpy(bunch.images[chosen].astype(np.float32) / 16.0).unsqueeze(1)
    big = torch.nn.functional.interpolate(small, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    images = (big.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    return ImageSet(
        name="digits",
        split=split,
        images=images,
        labels=torch.from_numpy(bunch.target[chosen].astype(np.int64)),
        classes=[str(k) for k in range(10)],
        meta={"source": "sklearn.datasets.load_digits", "split_seed": DIGITS_SPLIT_SEED},
    )


def imagenet_test_transform(resize: int = 256, crop: int = 224):
    """The standard ImageNet evaluation transform: resize 256, centre crop 224, to [0, 1] tensor."""
    from torchvision import transforms

    return transforms.Compose([transforms.Resize(resize), transforms.CenterCrop(crop), transforms.ToTensor()])


def load_image_folder(root: str | Path, split: str = "val", resize: int = 256, crop: int = 224):
    """An ImageNet-style folder (``root/split/<class>/<image>``) as a torchvision ``ImageFolder``.

    Items are ([0, 1] float (3, crop, crop), label) after the standard test transform; use
    :func:`folder_to_imageset` to materialise a subset as uint8 tensors (e.g. inversion targets).
    """
    from torchvision.datasets import ImageFolder

    base = Path(root).expanduser()
    folder = base / split
    if not folder.is_dir():
        splits = [s for s in ("train", "val", "test") if (base / s).is_dir()]
        if splits:  # the class folders of another split are not this split's images
            raise DataNotFoundError(f"no '{split}' folder under {base}, which has {splits}: add {base / split}/<class>/ images, or "
                                    "use a split it has (e.g. seed types other than train need no train split)")
        folder = base  # root is itself the class folders
    if not folder.is_dir() or not any(p.is_dir() for p in folder.iterdir()):
        raise DataNotFoundError(
            f"no ImageNet-style folder at {Path(root) / split}: expected one sub-folder per class "
            f"(e.g. {Path(root) / split / 'n01440764'}/*.JPEG). Set data.root to the directory holding '{split}/'."
        )
    return ImageFolder(str(folder), transform=imagenet_test_transform(resize, crop))


def folder_to_imageset(folder, index: Sequence[int], name: str = "imagenet", split: str = "val") -> ImageSet:
    """Materialise the items ``index`` of a folder data set as an in-memory uint8 :class:`ImageSet`."""
    images, labels = [], []
    for i in index:
        image, label = folder[int(i)]
        images.append((image.clamp(0, 1) * 255).round().to(torch.uint8))
        labels.append(label)
    return ImageSet(name, split, torch.stack(images), torch.tensor(labels, dtype=torch.long), list(folder.classes))
