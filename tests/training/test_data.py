"""Data sets: CIFAR pickle folders (written here and the real subset), digits, ImageNet-style folders."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from training.data import (
    DataNotFoundError,
    ImageSet,
    folder_to_imageset,
    load_cifar,
    load_dataset,
    load_digits,
    load_image_folder,
)


def write_cifar10_folder(root: Path, per_batch: int = 4, seed: int = 0) -> np.ndarray:
    """A CIFAR-10-layout folder with random images; returns the test images (N, 3072)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    test_data = None
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels, "batch_label": name, "filenames": [f"{i}.png" for i in range(per_batch)]}, f)
        if name == "test_batch":
            test_data = (data, labels)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{k}" for k in range(10)], "num_cases_per_batch": per_batch}, f)
    return test_data


def test_cifar_folder_written_here_loads_exactly(tmp_path):
    data, labels = write_cifar10_folder(tmp_path)
    test = load_cifar("cifar10", "test", root=tmp_path)
    train = load_dataset("cifar10", "train", root=tmp_path)
    assert test.images.dtype == torch.uint8 and test.images.shape == (4, 3, 32, 32)
    assert len(train) == 20
    # Channel-major rows: the first 1024 bytes are the red plane.
    assert torch.equal(test.images[1, 0].flatten(), torch.from_numpy(data[1, :1024]))
    assert torch.equal(test.images[1, 2].flatten(), torch.from_numpy(data[1, 2048:]))
    assert test.labels.tolist() == labels
    assert test.classes[3] == "class3"
    # The folder itself works as root too.
    assert len(load_cifar("cifar10", "test", root=tmp_path / "cifar-10-batches-py")) == 4


def test_real_cifar_subset(cifar_mini_root):
    train = load_dataset("cifar10", "train", root=cifar_mini_root)
    test = load_dataset("cifar10", "test", root=cifar_mini_root)
    assert len(train) == 5085 and len(test) == 1017
    assert test.labels[:5].tolist() == [3, 8, 8, 0, 6]
    assert test.classes[3] == "cat" and test.num_classes == 10
    assert test.images.shape[1:] == (3, 32, 32)


def test_missing_cifar_folder_says_where_to_put_files(tmp_path):
    with pytest.raises(DataNotFoundError, match="cifar-10-batches-py.*cifar-10-python.tar.gz"):
        load_dataset("cifar10", "test", root=tmp_path)
    with pytest.raises(DataNotFoundError, match="data.root"):
        load_dataset("cifar10", "test", root=None)


def test_corrupt_cifar_batch_is_refused(tmp_path):
    write_cifar10_folder(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x04garbage")
    with pytest.raises(ValueError, match=rf"truncated or corrupt.*re-extract the archive into {tmp_path}"):
        load_cifar("cifar10", "test", root=tmp_path)


def test_unknown_dataset_and_split():
    with pytest.raises(ValueError, match="unknown data set 'mnist'"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="unknown split"):
        load_dataset("digits", "validation")


def test_digits_is_a_fixed_stratified_split():
    train, test = load_digits("train"), load_digits("test")
    assert (len(train), len(test)) == (1347, 450)
    assert train.images.shape[1:] == (3, 32, 32) and train.images.dtype == torch.uint8
    assert torch.equal(train.images[:, 0], train.images[:, 1])  # grey: three equal channels
    assert sorted(set(test.labels.tolist())) == list(range(10))
    counts = torch.bincount(test.labels, minlength=10)
    assert counts.min() >= 43 and counts.max() <= 46  # stratified: ~45 per class
    assert torch.equal(load_digits("test").images, test.images)  # deterministic
    assert train.images.max() == 255 and train.images.min() == 0


def test_imageset_helpers():
    data = load_digits("test")
    x = data.float_images([0, 1])
    assert x.dtype == torch.float32 and x.shape == (2, 3, 32, 32) and 0 <= x.min() and x.max() <= 1
    sub = data.subset([3, 1])
    assert torch.equal(sub.labels, data.labels[[3, 1]])
    with pytest.raises(ValueError, match="uint8"):
        ImageSet("x", "test", torch.zeros(2, 3, 4, 4), torch.zeros(2, dtype=torch.long), ["a"])


def test_image_folder_uses_standard_test_transform(tmp_path):
    from PIL import Image

    for cls in ("n001", "n002"):
        (tmp_path / "val" / cls).mkdir(parents=True)
        Image.fromarray(np.full((300, 400, 3), 128, dtype=np.uint8)).save(tmp_path / "val" / cls / "a.png")
    folder = load_image_folder(tmp_path, "val")
    image, label = folder[1]
    assert image.shape == (3, 224, 224) and label == 1
    subset = folder_to_imageset(folder, [0, 1])
    assert subset.images.dtype == torch.uint8 and subset.labels.tolist() == [0, 1]
    with pytest.raises(DataNotFoundError, match="one sub-folder per class"):
        load_image_folder(tmp_path / "nowhere", "val")
    # a root with val/ only has no train split: its validation images were loaded as one class called 'val'
    with pytest.raises(DataNotFoundError, match=r"no 'train' folder under .* which has \['val'\]"):
        load_image_folder(tmp_path, "train")
    assert len(load_image_folder(tmp_path / "val", "train").classes) == 2  # a root that is the class folders itself


class _RunsCode:
    def __reduce__(self):
        import os

        return (os.system, ("touch ran-code",))


def test_a_cifar_file_cannot_run_code_and_corrupt_ones_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_cifar10_folder(tmp_path / "data")
    test_batch = tmp_path / "data" / "cifar-10-batches-py" / "test_batch"
    with open(test_batch, "wb") as f:
        pickle.dump({"data": np.zeros((1, 3072), dtype=np.uint8), "labels": [0], "payload": _RunsCode()}, f)
    with pytest.raises(ValueError, match="refers to posix.system.*could run code"):
        load_cifar("cifar10", "test", root=tmp_path / "data")
    assert not (tmp_path / "ran-code").exists()
    pickled = pickle.dumps({"data": np.zeros((4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 3]})
    test_batch.write_bytes(pickled[:20] + b"\xff" * 8 + pickled[28:])  # a flipped header fails in all sorts of ways
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_cifar("cifar10", "test", root=tmp_path / "data")


def test_cifar_labels_outside_the_classes_are_refused(tmp_path):
    write_cifar10_folder(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({"data": np.zeros((2, 3072), dtype=np.uint8), "labels": [3, 57]}, f)
    with pytest.raises(ValueError, match=r"labels \[57\] lie outside the 10 classes"):
        load_cifar("cifar10", "test", root=tmp_path)


@pytest.mark.parametrize("data, message", [
    (np.zeros((2, 32, 32, 3), dtype=np.uint8), r"shape \(2, 32, 32, 3\), expected one row of 3072 .*torchvision's HWC \.data"),
    (np.full((2, 3072), 0.5, dtype=np.float32), r"holds float32 values in \[0\.5, 0\.5\], expected one row of 3072 integers in 0\.\.255"),
    (np.full((2, 3072), 300, dtype=np.int64), r"holds int64 values in \[300, 300\]"),
])
def test_cifar_rows_in_another_layout_are_refused_not_scrambled(tmp_path, data, message):
    """A subset written from torchvision's (N, 32, 32, 3) .data loaded as scrambled images; [0, 1] floats as black ones."""
    write_cifar10_folder(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({"data": data, "labels": [0, 1]}, f)
    with pytest.raises(ValueError, match=message):
        load_cifar("cifar10", "test", root=tmp_path)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_cifar_subset_pickled_with_any_protocol_loads(tmp_path, protocol):
    """Protocol 5 (pickle.HIGHEST_PROTOCOL) stores arrays through numpy's _frombuffer, protocol 2 bytes through
    _codecs.encode: both were refused as 'truncated or corrupt'."""
    write_cifar10_folder(tmp_path)
    data = np.arange(2 * 3072, dtype=np.int64).reshape(2, 3072).astype(np.uint8)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({"data": data, "labels": [3, 4], b"batch_label": b"bytes"}, f, protocol=protocol)
    test = load_cifar("cifar10", "test", root=tmp_path)
    assert test.labels.tolist() == [3, 4] and torch.equal(test.images.flatten(1), torch.from_numpy(data))


@pytest.mark.parametrize("content, message", [
    ({"data": np.zeros((2, 3072), dtype=np.uint8)}, r"test_batch holds a dict with the keys \['data'\], not CIFAR's layout: .*missing 'labels'"),
    ([np.zeros((2, 3072), dtype=np.uint8)], r"test_batch holds a list, not CIFAR's layout"),
    ({"data": np.zeros((2, 3072), dtype=np.uint8), "labels": [1]}, r"test_batch holds 2 images but 1 labels: one label per image"),
])
def test_a_cifar_file_of_another_layout_is_named_with_what_it_holds(tmp_path, content, message):
    write_cifar10_folder(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump(content, f)
    with pytest.raises(ValueError, match=message):
        load_cifar("cifar10", "test", root=tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "batches.meta", "wb") as f:
        pickle.dump({"names": ["a"]}, f)
    with pytest.raises(ValueError, match=r"batches.meta holds a dict with the keys \['names'\].*missing 'label_names'"):
        load_cifar("cifar10", "train", root=tmp_path)
