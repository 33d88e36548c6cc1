"""Cost of ``invert.deterministic`` on CUDA (run it on a GPU machine; it writes ``$OUT/deterministic_cost_h100.json``).

The engine on a CIFAR ResNet18 (random weights), 200 items x 300 L2 steps, bf16 and channels-last, one micro-batch,
with deterministic cuDNN kernels off and on, alternating. Result on one H100: benchmarks/results/deterministic_cost_h100.json.
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from invert import Engine, InversionLoss, noise_images  # noqa: E402
from training import Representation, build_model  # noqa: E402

ITEMS, STEPS = 200, 300


def main() -> None:
    torch.manual_seed(0)
    rep = Representation(build_model("resnet18", "cifar10")).cuda()
    targets = torch.rand(ITEMS, 3, 32, 32, device="cuda")
    seeds = noise_images(ITEMS, (3, 32, 32), seed=1, device="cuda")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "items": ITEMS, "steps": STEPS}
    for deterministic in (False, True, False, True):
        engine = Engine(steps=STEPS, precision="bf16", channels_last=True, deterministic=deterministic, progress=False, log_every=50,
                        micro_batch=ITEMS)
        engine.run(InversionLoss(rep, targets[:8]), seeds[:8])  # warm-up
        objective = InversionLoss(rep, targets)
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = engine.run(objective, seeds)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        out.setdefault(f"deterministic={deterministic}", []).append({
            "seconds": round(seconds, 3), "item_steps_per_s": round(ITEMS * STEPS / seconds),
            "median_distance": round(result.best_loss.median().item(), 4),
        })
    print(json.dumps(out, indent=1))
    with open(os.path.join(os.environ.get("OUT", "."), "deterministic_cost_h100.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
