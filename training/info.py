"""``python -m training.info model=NAME data=NAME [data.root=PATH]``: what a model and a data set look like.

Prints the model's parameter count, its layer names, the representation's shape and the data
set's sizes, e.g. ``python -m training.info model=resnet18 data=cifar10 data.root=$HOME/data``.
"""
from __future__ import annotations

import hydra
import torch
from omegaconf import DictConfig

from .config import concise_errors, dataset_from_config, model_from_config, representation_from_config
from .data import IMAGE_SIZE, IN_MEMORY, DataNotFoundError, ImageSet
from .representation import list_layers


def describe(cfg: DictConfig) -> str:
    dataset = cfg.data.name
    model = model_from_config(cfg.model, dataset)
    rep = representation_from_config(model, cfg.model)
    size = IMAGE_SIZE.get(dataset, 32)
    with torch.no_grad():
        features = rep(torch.rand(2, 3, size, size))
    layers = list_layers(model)
    lines = [
        f"model          {model.arch} for {dataset} ({model.num_classes} classes)",
        f"parameters     {sum(p.numel() for p in model.parameters()):,}",
        f"representation layer {rep.layer!r}, fake_relu={rep.fake_relu}, pool={rep.pool}: shape (N, {features.shape[1]})",
        f"layers ({len(layers)}): {', '.join(layers)}",
    ]
    absent = []
    for split in ("train", "test"):
        try:
            data = dataset_from_config(cfg.data, split)
        except DataNotFoundError as err:
            if dataset in IN_MEMORY:  # a file of the data set is missing: the whole set is unusable
                raise
            absent.append(err)  # an ImageNet root often holds val/ only (conf/data/imagenet.yaml)
            lines.append(f"data {split:<9} absent: {str(err).splitlines()[0]}")
            continue
        if isinstance(data, ImageSet):
            lines.append(f"data {split:<9} {len(data):,} images {tuple(data.images.shape[1:])} uint8, {data.num_classes} classes")
        else:
            lines.append(f"data {split:<9} {len(data):,} images in {len(data.classes)} class folders")
    if len(absent) == 2:
        raise absent[0]
    return "\n".join(lines)


@hydra.main(config_path="pkg://conf", config_name="config", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    print(describe(cfg))


if __name__ == "__main__":
    import sys

    from .config import run_checked

    run_checked("config", sys.argv[1:])
    main()
