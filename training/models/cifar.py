"""CIFAR-size (32x32) architectures whose state-dict keys equal the `robustness` library's.

The module names (``conv1``, ``layer1.0.shortcut.0``, ``features.3``, ``dense2.5.conv1``,
``Mixed_6b.branch7x7.1.conv`` …) follow ``robustness.cifar_models`` (Engstrom et al., 2019) so
that the library's checkpoints load into these networks unchanged; the forward passes compute
the same functions. Differences: no ``with_latent`` / ``fake_relu`` arguments (the
representation wrapper picks layers by name and applies a fake ReLU itself), and each network
names the layer whose globally pooled output is its representation (``penultimate``).

The k-WTA ResNet18 follows Xiao et al., "Enhancing Adversarial Defense by k-Winners-Take-All"
(ICLR 2020) and their ``Sparsify2D_vol``: per sample, keep the activations that are at least the
k-th largest over C·H·W (k = ⌊ratio·C·H·W⌋), zero the rest.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from invert.validation import check_whole

from .registry import register_model

Activation = Callable[[], nn.Module]


@torch.fx.wrap
def k_winners_take_all(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """Keep, per sample, the values at least as large as the k-th largest over C·H·W (k = ⌊ratio·C·H·W⌋).

    Wrapped for torch.fx: ``k`` depends on the input's shape, so the representation wrapper's
    tracer keeps this as one call instead of tracing through it.
    """
    flat = x.flatten(1)
    k = max(1, int(ratio * flat.shape[1]))
    threshold = flat.topk(k, dim=1).values[:, -1:]
    return x * (flat >= threshold).view_as(x).to(x.dtype)


class KWinnersTakeAll(nn.Module):
    """k-WTA activation over the whole C·H·W volume of each sample (Xiao et al., 2020)."""

    def __init__(self, ratio: float = 0.1):
        super().__init__()
        if not 0 < ratio <= 1:
            raise ValueError(f"k-WTA sparsity ratio must be in (0, 1], got {ratio}")
        self.ratio = ratio

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return k_winners_take_all(x, self.ratio)

    def extra_repr(self) -> str:
        return f"ratio={self.ratio}"


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, activation: Activation = nn.ReLU):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride)
        self.act1 = activation()
        self.act_out = activation()  # the block's output activation: a fake ReLU goes here

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act_out(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1, activation: Activation = nn.ReLU):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride)
        self.act1, self.act2, self.act_out = activation(), activation(), activation()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.act2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.act_out(out + self.shortcut(x))


def _shortcut(in_planes: int, out_planes: int, stride: int) -> nn.Sequential:
    if stride == 1 and in_planes == out_planes:
        return nn.Sequential()
    return nn.Sequential(nn.Conv2d(in_planes, out_planes, 1, stride, bias=False), nn.BatchNorm2d(out_planes))


class ResNet(nn.Module):
    penultimate = "layer4"

    def __init__(self, block, num_blocks, num_classes: int = 10, activation: Activation = nn.ReLU, width: int = 64,
                 stem_activation: Activation | None = None):
        super().__init__()
        check_whole(width, "ResNet width (the first stage's channels, 64 in the paper)", least=1)
        self.in_planes = width
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = (stem_activation or activation)()
        self.layer1 = self._make_layer(block, width, num_blocks[0], 1, activation)
        self.layer2 = self._make_layer(block, 2 * width, num_blocks[1], 2, activation)
        self.layer3 = self._make_layer(block, 4 * width, num_blocks[2], 2, activation)
        self.layer4 = self._make_layer(block, 8 * width, num_blocks[3], 2, activation)
        self.linear = nn.Linear(8 * width * block.expansion, num_classes)

    def _make_layer(self, block, planes, count, stride, activation) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (count - 1):
            layers.append(block(self.in_planes, planes, s, activation))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        # Global average pool: the library's avg_pool2d(out, 4) on 32x32 inputs.
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))


def _resnet_kwargs(state) -> dict:
    first = state.get("net.conv1.weight")
    return {} if first is None else {"width": int(first.shape[0])}


# ``width`` (64 in the paper) scales every stage; narrow ResNets (width 8-16) keep the residual structure at a CPU budget.
@register_model("resnet18", penultimate="layer4", fake_relu=True, infer_kwargs=_resnet_kwargs)
def resnet18(num_classes: int = 10, width: int = 64) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, width=width)


@register_model("resnet50", penultimate="layer4", fake_relu=True, infer_kwargs=_resnet_kwargs)
def resnet50(num_classes: int = 10, width: int = 64) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, width=width)


@register_model("kwta_resnet18", penultimate="layer4", fake_relu=False, infer_kwargs=_resnet_kwargs)
def kwta_resnet18(num_classes: int = 10, ratio: float = 0.1, width: int = 64) -> ResNet:
    """ResNet18 whose blocks use k-WTA activations keeping a fraction ``ratio`` of each sample's C·H·W units.

    As Xiao et al.'s ``SparseResNet`` (ICLR 2020, ``kWTA/resnet.py``; the authors' copy in ``deep-learning-base``):
    k-WTA after each block's first BatchNorm and after the residual sum, no ReLU there, and a plain ReLU in the
    stem. The ratio is one for all stages over the whole volume (Xiao et al.'s released CIFAR model,
    ``sparse_func='vol'``, 0.1); Nanda et al.'s registry default is per-channel k-WTA (``'reg'``) with ratios
    0.5, 0.4, 0.3, 0.2 per stage, which this network does not offer.
    """
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, activation=lambda: KWinnersTakeAll(ratio), width=width,
                  stem_activation=nn.ReLU)


_VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class VGG(nn.Module):
    penultimate = "features"

    def __init__(self, config=_VGG16, num_classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in config:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, item, 3, padding=1), nn.BatchNorm2d(item), nn.ReLU(inplace=True)]
                channels = item
        layers.append(nn.AvgPool2d(1, 1))  # an identity kept for the library's layer indices
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def _vgg_kwargs(state) -> dict:
    first = state.get("net.features.0.weight")
    return {} if first is None else {"width": int(first.shape[0])}


@register_model("vgg16", penultimate="features", fake_relu=False, infer_kwargs=_vgg_kwargs)
def vgg16(num_classes: int = 10, width: int = 64) -> VGG:
    """VGG16 with batch norm (the library's CIFAR VGG); ``width`` (64 in the paper) scales every layer."""
    if width < 1:
        raise ValueError(f"VGG width (the first layer's channels, 64 in the paper) must be positive, got {width}")
    return VGG([item if item == "M" else item * width // 64 for item in _VGG16], num_classes)


class WideBasicBlock(nn.Module):
    """Pre-activation block of Zagoruyko & Komodakis's WRN as TRADES, MART and RobustBench write it: where the
    channels or stride change, the shortcut convolution takes the block's *activated* input (``convShortcut``)."""

    def __init__(self, in_planes: int, out_planes: int, stride: int, drop_rate: float = 0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.relu1 = nn.ReLU()
        self.conv1 = nn.Conv2d(in_planes, out_planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes)
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_planes, out_planes, 3, 1, 1, bias=False)
        self.drop_rate = drop_rate
        self.equal_in_out = in_planes == out_planes and stride == 1
        self.convShortcut = None if self.equal_in_out else nn.Conv2d(in_planes, out_planes, 1, stride, 0, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activated = self.relu1(self.bn1(x))
        out = self.relu2(self.bn2(self.conv1(activated)))
        if self.drop_rate > 0:
            out = F.dropout(out, p=self.drop_rate, training=self.training)
        return (x if self.equal_in_out else self.convShortcut(activated)) + self.conv2(out)


class WideStage(nn.Module):
    """``NetworkBlock``: ``count`` wide blocks under the reference's name ``layer``."""

    def __init__(self, count: int, in_planes: int, out_planes: int, stride: int, drop_rate: float):
        super().__init__()
        self.layer = nn.Sequential(*[WideBasicBlock(in_planes if i == 0 else out_planes, out_planes, stride if i == 0 else 1, drop_rate)
                                     for i in range(count)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class WideResNet(nn.Module):
    """WRN-depth-k for 32 px images (Zagoruyko & Komodakis, 2016) with the module names of TRADES's
    ``models/wideresnet.py`` (also MART's and RobustBench's ``WideResNet``), so their checkpoints load unchanged
    (their unused ``sub_block1`` is dropped on load: :data:`WIDE_RESNET_UNUSED`). The forward pass is theirs:
    ``avg_pool2d(out, 8)`` on 32 px inputs is the global average pool used here; their in-place ReLUs are not."""

    penultimate = "act_out"

    def __init__(self, depth: int = 34, widen_factor: int = 10, num_classes: int = 10, drop_rate: float = 0.0):
        super().__init__()
        check_whole(depth, "WideResNet depth")
        if depth < 10 or (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6n + 4 with n >= 1 (10, 16, 28, 34, ...), got {depth!r}")
        check_whole(widen_factor, "WideResNet widen_factor", least=1, why=" (10 in WRN-34-10)")
        if not 0 <= drop_rate < 1:
            raise ValueError(f"WideResNet drop_rate must be in [0, 1), got {drop_rate!r}")
        count, channels = (depth - 4) // 6, [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.conv1 = nn.Conv2d(3, channels[0], 3, 1, 1, bias=False)
        self.block1 = WideStage(count, channels[0], channels[1], 1, drop_rate)
        self.block2 = WideStage(count, channels[1], channels[2], 2, drop_rate)
        self.block3 = WideStage(count, channels[2], channels[3], 2, drop_rate)
        self.bn1 = nn.BatchNorm2d(channels[3])
        self.act_out = nn.ReLU()  # the reference's ``relu``: a fake ReLU goes here
        self.fc = nn.Linear(channels[3], num_classes)
        for module in self.modules():  # the reference's initialisation
            if isinstance(module, nn.Conv2d):
                nn.init.normal_(module.weight, 0, math.sqrt(2.0 / (module.kernel_size[0] * module.kernel_size[1] * module.out_channels)))
            elif isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block3(self.block2(self.block1(self.conv1(x))))
        out = self.act_out(self.bn1(out))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


# Saved by the reference implementations but used by no forward pass: TRADES's ``sub_block1`` (a copy of block1's shape).
WIDE_RESNET_UNUSED = ("net.sub_block1.",)


def _wide_resnet_kwargs(state) -> dict:
    first = state.get("net.block1.layer.0.conv1.weight")
    if first is None:
        return {}
    blocks = {k.split(".")[3] for k in state if k.startswith("net.block1.layer.") and k.endswith(".conv1.weight")}
    return {"depth": 6 * len(blocks) + 4, "widen_factor": int(first.shape[0]) // 16}


@register_model("wide_resnet", penultimate="act_out", fake_relu=True, infer_kwargs=_wide_resnet_kwargs, unused_keys=WIDE_RESNET_UNUSED)
def wide_resnet(num_classes: int = 10, depth: int = 34, widen_factor: int = 10, drop_rate: float = 0.0) -> WideResNet:
    """WRN-34-10 by default, the architecture of TRADES, MART and most RobustBench CIFAR entries (WRN-28-10:
    ``depth=28``)."""
    return WideResNet(depth, widen_factor, num_classes, drop_rate)


class DenseLayer(nn.Module):
    def __init__(self, in_planes: int, growth_rate: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, 4 * growth_rate, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(4 * growth_rate)
        self.conv2 = nn.Conv2d(4 * growth_rate, growth_rate, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return torch.cat([out, x], 1)


class Transition(nn.Module):
    def __init__(self, in_planes: int, out_planes: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(in_planes)
        self.conv = nn.Conv2d(in_planes, out_planes, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(self.conv(F.relu(self.bn(x))), 2)


class DenseNet(nn.Module):
    penultimate = "act_out"

    def __init__(self, blocks=(6, 12, 24, 16), growth_rate: int = 32, reduction: float = 0.5, num_classes: int = 10):
        super().__init__()
        planes = 2 * growth_rate
        self.conv1 = nn.Conv2d(3, planes, 3, padding=1, bias=False)
        for stage, count in enumerate(blocks, start=1):
            dense = nn.Sequential(*[DenseLayer(planes + i * growth_rate, growth_rate) for i in range(count)])
            setattr(self, f"dense{stage}", dense)
            planes += count * growth_rate
            if stage < len(blocks):
                out_planes = int(math.floor(planes * reduction))
                setattr(self, f"trans{stage}", Transition(planes, out_planes))
                planes = out_planes
        self.bn = nn.BatchNorm2d(planes)
        self.act_out = nn.ReLU()
        self.linear = nn.Linear(planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        out = self.trans1(self.dense1(out))
        out = self.trans2(self.dense2(out))
        out = self.trans3(self.dense3(out))
        out = self.act_out(self.bn(self.dense4(out)))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))


@register_model("densenet121", penultimate="act_out", fake_relu=True)
def densenet121(num_classes: int = 10) -> DenseNet:
    return DenseNet((6, 12, 24, 16), 32, num_classes=num_classes)


class BasicConv2d(nn.Sequential):
    """Conv (no bias) - BN - ReLU, with the library's names ``conv`` and ``bn``."""

    def __init__(self, in_channels: int, out_channels: int, **conv_kwargs):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **conv_kwargs)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)


class _Concat(nn.Module):
    """Runs the named branches on the same input and concatenates their outputs on channels."""

    branches: tuple[str, ...] = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([getattr(self, name)(x) for name in self.branches], 1)


class InceptionA(_Concat):
    branches = ("branch1x1", "branch5x5", "branch3x3", "branchpool")

    def __init__(self, cin: int, pool_features: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, kernel_size=1)
        self.branch5x5 = nn.Sequential(BasicConv2d(cin, 48, kernel_size=1), BasicConv2d(48, 64, kernel_size=5, padding=2))
        self.branch3x3 = nn.Sequential(
            BasicConv2d(cin, 64, kernel_size=1),
            BasicConv2d(64, 96, kernel_size=3, padding=1),
            BasicConv2d(96, 96, kernel_size=3, padding=1),
        )
        self.branchpool = nn.Sequential(
            nn.AvgPool2d(3, 1, 1), BasicConv2d(cin, pool_features, kernel_size=3, padding=1)
        )


class InceptionB(_Concat):
    branches = ("branch3x3", "branch3x3stack", "branchpool")

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, kernel_size=3, stride=2)
        self.branch3x3stack = nn.Sequential(
            BasicConv2d(cin, 64, kernel_size=1),
            BasicConv2d(64, 96, kernel_size=3, padding=1),
            BasicConv2d(96, 96, kernel_size=3, stride=2),
        )
        self.branchpool = nn.MaxPool2d(3, 2)


class InceptionC(_Concat):
    branches = ("branch1x1", "branch7x7", "branch7x7stack", "branch_pool")

    def __init__(self, cin: int, c7: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, kernel_size=1)
        self.branch7x7 = nn.Sequential(
            BasicConv2d(cin, c7, kernel_size=1),
            BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0)),
            BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3)),
        )
        self.branch7x7stack = nn.Sequential(
            BasicConv2d(cin, c7, kernel_size=1),
            BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0)),
            BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3)),
            BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0)),
            BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3)),
        )
        self.branch_pool = nn.Sequential(nn.AvgPool2d(3, 1, 1), BasicConv2d(cin, 192, kernel_size=1))


class InceptionD(_Concat):
    branches = ("branch3x3", "branch7x7", "branchpool")

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = nn.Sequential(BasicConv2d(cin, 192, kernel_size=1), BasicConv2d(192, 320, kernel_size=3, stride=2))
        self.branch7x7 = nn.Sequential(
            BasicConv2d(cin, 192, kernel_size=1),
            BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3)),
            BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0)),
            BasicConv2d(192, 192, kernel_size=3, stride=2),
        )
        self.branchpool = nn.AvgPool2d(3, 2)


class InceptionE(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(cin, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3stack_1 = BasicConv2d(cin, 448, kernel_size=1)
        self.branch3x3stack_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3stack_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3stack_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = nn.Sequential(nn.AvgPool2d(3, 1, 1), BasicConv2d(cin, 192, kernel_size=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_1(x)
        s3 = self.branch3x3stack_2(self.branch3x3stack_1(x))
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch3x3_2a(b3),
                self.branch3x3_2b(b3),
                self.branch3x3stack_3a(s3),
                self.branch3x3stack_3b(s3),
                self.branch_pool(x),
            ],
            1,
        )


class InceptionV3(nn.Module):
    """The library's CIFAR InceptionV3 (no stem down-sampling; 32 → 30 → 14 → 6 px grids)."""

    penultimate = "Mixed_7c"

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, padding=1)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3, padding=1)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.Mixed_5b = InceptionA(192, 32)
        self.Mixed_5c = InceptionA(256, 64)
        self.Mixed_5d = InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, 128)
        self.Mixed_6c = InceptionC(768, 160)
        self.Mixed_6d = InceptionC(768, 160)
        self.Mixed_6e = InceptionC(768, 192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.dropout = nn.Dropout(0.5)
        self.linear = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in (
            "Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "Conv2d_3b_1x1", "Conv2d_4a_3x3",
            "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d",
            "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c",
        ):  # fmt: skip
            x = getattr(self, name)(x)
        # The library applies Dropout2d to the pooled (N, 2048, 1, 1) map, which drops whole features:
        # the same as element-wise dropout on the flattened vector.
        return self.linear(self.dropout(F.adaptive_avg_pool2d(x, 1).flatten(1)))


@register_model("inception_v3", penultimate="Mixed_7c", fake_relu=False)
def inception_v3(num_classes: int = 10) -> InceptionV3:
    return InceptionV3(num_classes)


class SmallCNN(nn.Module):
    """A small fast CNN for digits and tests: 4 conv-BN-activation layers (two stride-2), pooled 4*width-d features."""

    penultimate = "features"

    def __init__(self, num_classes: int = 10, width: int = 32, activation: Activation = nn.ReLU):
        super().__init__()
        check_whole(width, "small CNN width (the first layer's channels, 32 by default)", least=1)  # 0 and 2.5 failed inside Conv2d
        w = width
        layers: list[nn.Module] = []
        for cin, cout, stride in ((3, w, 1), (w, 2 * w, 2), (2 * w, 4 * w, 2), (4 * w, 4 * w, 1)):
            layers += [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), activation()]
        self.features = nn.Sequential(*layers)
        self.linear = nn.Linear(4 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


def _small_cnn_kwargs(state) -> dict:
    first = state.get("net.features.0.weight")
    return {} if first is None else {"width": int(first.shape[0])}


@register_model("small_cnn", penultimate="features", fake_relu=True, infer_kwargs=_small_cnn_kwargs)
def small_cnn(num_classes: int = 10, width: int = 32) -> SmallCNN:
    return SmallCNN(num_classes, width)


@register_model("kwta_small_cnn", penultimate="features", fake_relu=False, infer_kwargs=_small_cnn_kwargs)
def kwta_small_cnn(num_classes: int = 10, width: int = 32, ratio: float = 0.1) -> SmallCNN:
    """small_cnn with every ReLU replaced by k-WTA (Xiao et al. 2020): the CPU-sized stand-in for
    ``kwta_resnet18`` in the audit's fast tests (same activation, 4 layers instead of 18)."""
    return SmallCNN(num_classes, width, activation=lambda: KWinnersTakeAll(ratio))
