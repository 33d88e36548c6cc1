"""Cost of invert.deterministic on CUDA (run on a GPU machine; writes $OUT/deterministic_cost_h100.json): the engine on a
CIFAR ResNet18 (random weights), 200 items x 300 steps, bf16 + channels-last, deterministic cuDNN off and on, alternating."""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from invert import Engine, InversionLoss, noise_images
from training import Representation, build_model

torch.manual_seed(0)
rep = Representation(build_model("resnet18", "cifar10")).cuda()
targets = torch.rand(200, 3, 32, 32, device="cuda")
seeds = noise_images(200, (3, 32, 32), seed=1, device="cuda")
out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "items": 200, "steps": 300}
for det in (False, True, False, True):
    eng = Engine(steps=300, precision="bf16", channels_last=True, deterministic=det, progress=False, log_every=50, micro_batch=200)
    obj = InversionLoss(rep, targets)
    eng.run(InversionLoss(rep, targets[:8]), seeds[:8])  # warm-up
    torch.cuda.synchronize(); t = time.perf_counter()
    res = eng.run(obj, seeds)
    torch.cuda.synchronize(); dt = time.perf_counter() - t
    out.setdefault(f"deterministic={det}", []).append({"seconds": round(dt, 3), "item_steps_per_s": round(200 * 300 / dt), "median_distance": round(res.best_loss.median().item(), 4)})
    print(det, dt, flush=True)
print(json.dumps(out, indent=1))
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "deterministic_cost_h100.json"), "w"), indent=1)
