"""Our APGD-CE / APGD-T (``training.strong_attacks.apgd``) against torchattacks' port of fra31/auto-attack on the same
model and images: robust accuracies should agree within 1 point. Square (Linf and L2) is compared as well, for
information only (random search: the two draw different squares).

torchattacks is NOT a dependency of the toolkit (it pins requests 2.25, which conflicts with selenium's urllib3 in
the dev environment) and this script installs nothing: it runs where torchattacks is importable, e.g.

    pip install --no-deps --target /tmp/ta torchattacks==3.5.1
    PYTHONPATH=.:/tmp/ta python benchmarks/compare_apgd_torchattacks.py

The model: small_cnn (width 8) trained for 3 epochs of SGD on the embedded digits (the attack tests' model,
tests/conftest.py), the first 96 test images; Linf 1/255 and 4/255, L2 0.15 and 0.5; 25 steps, one restart, 3 target classes for APGD-T.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from training import build_model, load_dataset
from training.attacks import ThreatModel
from training.strong_attacks import apgd, square

try:
    from .results_io import environment, write_result
except ImportError:  # run as a script
    from results_io import environment, write_result


def digits_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    train = load_dataset("digits", "train")
    model = build_model("small_cnn", "digits", width=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x_all, y_all = train.float_images(slice(0, len(train))), train.labels
    model.train()
    for _ in range(3):
        for index in torch.randperm(len(train)).split(64):
            optimizer.zero_grad()
            F.cross_entropy(model(x_all[index]), y_all[index]).backward()
            optimizer.step()
    return model.eval().requires_grad_(False)


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--square-queries", type=int, default=300)
    args = parser.parse_args(argv)
    import torchattacks  # noqa: PLC0415  (optional: see the module docstring)

    torch.set_num_threads(1)
    model = digits_cnn()
    test = load_dataset("digits", "test")
    x, y = test.float_images(slice(0, 96)), test.labels[:96]
    rows = []
    for norm, eps in (("linf", 1 / 255), ("linf", 4 / 255), ("l2", 0.15), ("l2", 0.5)):  # mid-range and near-zero robust accuracy
        name = "L2" if norm == "l2" else "Linf"
        threat = ThreatModel(norm, eps, steps=args.steps)
        started = time.perf_counter()
        row = {"norm": norm, "eps": eps, "steps": args.steps, "clean": accuracy(model, x, y)}
        row["apgd_ce_ours"] = accuracy(model, apgd(model, x, y, threat, loss="ce", generator=torch.Generator().manual_seed(0)), y)
        row["apgd_ce_torchattacks"] = accuracy(model, torchattacks.APGD(model, norm=name, eps=eps, steps=args.steps, seed=0, loss="ce")(x, y), y)
        row["apgd_t_ours"] = accuracy(model, apgd(model, x, y, threat, loss="dlr-targeted", n_targets=3, generator=torch.Generator().manual_seed(0)), y)
        row["apgd_t_torchattacks"] = accuracy(model, torchattacks.APGDT(model, norm=name, eps=eps, steps=args.steps, seed=0, n_classes=4)(x, y), y)
        row["square_ours"] = accuracy(model, square(model, x, y, norm, eps, queries=args.square_queries, generator=torch.Generator().manual_seed(0)), y)
        row["square_torchattacks"] = accuracy(model, torchattacks.Square(model, norm=name, eps=eps, n_queries=args.square_queries, seed=0)(x, y), y)
        # "Within 1 point" on 96 images is one image either way (1.04 points): compare counts, not a 0.01 that one image exceeds.
        row["apgd_within_1_point"] = all(abs(row[f"{k}_ours"] - row[f"{k}_torchattacks"]) * len(y) <= 1 + 1e-6 for k in ("apgd_ce", "apgd_t"))
        row["seconds"] = round(time.perf_counter() - started, 1)
        print(row)
        rows.append(row)
    report = {**environment(torch.device("cpu")), "torchattacks": torchattacks.__version__, "images": len(y),
              "model": "small_cnn width 8, digits, 3 epochs SGD", "rows": rows, "agree": all(r["apgd_within_1_point"] for r in rows)}
    write_result(report, "apgd_vs_torchattacks", torch.device("cpu"), args.out)  # it says where
    return report


if __name__ == "__main__":
    main()
