"""The representation wrapper: [0, 1] images → (N, D) features of a named layer.

The network is traced with ``torchvision.models.feature_extraction`` and cut at the chosen layer,
so nothing after it runs. Layer names are torch.fx node names inside ``Classifier.net``
(``layer4``, ``layer3.1.act_out``, ``features.29`` …; :func:`list_layers` lists them); a module
name stands for its last operation. The default is the architecture's penultimate layer, globally
average-pooled — the representation Nanda et al. (2023) invert, equal to the ``robustness``
library's ``with_latent`` output.

Fake ReLU (Engstrom et al., ``robustness``'s ``fake_relu=True``): the ReLU that produces the
chosen layer is replaced by one that is a ReLU forwards and the identity backwards, so inversion
can move units that are currently dead. It is applied by rewriting that graph node; if the layer's
last operation is not a ReLU (VGG's pooling, k-WTA), it would change nothing and a warning says so.
"""
from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torch import fx, nn

from invert.modules import kept_training_flags
from invert.validation import check_images

Pool = Literal["auto", "avg", "flatten"]


class _FakeReLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


@torch.fx.wrap
def fake_relu(x: torch.Tensor) -> torch.Tensor:
    """ReLU forwards, identity backwards."""
    return _FakeReLUFunction.apply(x)


_RELU_FUNCTIONS = {F.relu, torch.relu, torch.relu_, F.relu_}


def _is_relu(node: fx.Node, gm: fx.GraphModule) -> bool:
    if node.op == "call_function":
        return node.target in _RELU_FUNCTIONS
    if node.op == "call_method":
        return node.target in ("relu", "relu_")
    if node.op == "call_module":
        return isinstance(gm.get_submodule(node.target), nn.ReLU)
    return False


def _split(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """(network to trace, normaliser) for a Classifier; a plain module is traced whole."""
    if hasattr(model, "net") and hasattr(model, "normalize"):
        return model.net, model.normalize
    return model, None


def _penultimate(model: nn.Module) -> tuple[str | None, nn.Module]:
    """The penultimate layer's name and the classifier that names it: the model's own, or, for a wrapper around exactly one
    zoo classifier (a defence's input transform or noise in front of one), that classifier's layer by its path in the
    wrapper (``base.net.layer4``), so the wrapper's own operations stay in front of it. (None, model) when there is none
    or more than one (an ensemble: which would it be?)."""
    if hasattr(model, "penultimate"):  # penultimate=None on purpose: none, whatever the module wraps
        return model.penultimate, model
    inner = [(name, module) for name, module in model.named_modules()
             if name and getattr(module, "penultimate", None) is not None and hasattr(module, "net") and hasattr(module, "normalize")]
    if len(inner) != 1:
        return None, model
    name, classifier = inner[0]
    return f"{name}.net.{classifier.penultimate}", classifier


def _untraceable(model: nn.Module, err: Exception) -> ValueError:
    """A ValueError (what the callers that can do without a representation catch) for a forward pass torch.fx cannot trace."""
    return ValueError(f"{type(model).__name__} cannot be traced by torch.fx to cut it at a layer ({type(err).__name__}: {err}): its forward "
                      "must not loop over or branch on the images' values or sizes")


def list_layers(model: nn.Module) -> list[str]:
    """Names accepted as ``layer`` (eval-mode torch.fx node names of the network), in execution order."""
    from torchvision.models.feature_extraction import get_graph_node_names

    net, _ = _split(model)
    with kept_training_flags(net):
        _, eval_nodes = get_graph_node_names(net)
    return [name for name in eval_nodes if name not in ("x", "input")]


def _resolve_layer(net: nn.Module, layer: str, names: list[str]) -> str:
    """A node name, or a module name meaning its last node."""
    if layer in names:
        return layer
    module_names = {n for n, _ in net.named_modules() if n}
    prefixed = [n for n in names if n.startswith(layer + ".") or n.startswith(layer + "_")]
    if layer in module_names and prefixed:
        return prefixed[-1]
    close = [n for n in names if layer.split(".")[0] in n][:8] or names[-8:]
    raise ValueError(
        f"unknown layer {layer!r}: use a node or module name of the network, e.g. {close} "
        f"(training.representation.list_layers(model) lists all {len(names)})"
    )


class Representation(nn.Module):
    """[0, 1] images (N, C, H, W) → (N, D) features of ``layer``.

    Args:
        model: a :class:`~training.models.Classifier` (normalisation inside) or any module that takes
            [0, 1] images.
        layer: node or module name inside the network; ``None`` or ``"penultimate"`` = the
            architecture's representation layer (for a module wrapping one zoo classifier, that classifier's).
        fake_relu: identity-backward ReLU at that layer; ``None`` = the architecture's default.
        pool: ``"avg"`` global average pool of (N, C, H, W) maps, ``"flatten"`` keeps every unit,
            ``"auto"`` = avg for the penultimate layer and flatten otherwise.

    The representation shares the model's layers and leaves their modes as they are: features follow the model's
    mode (:func:`training.build_model` returns models in eval mode; a model in train mode gives BatchNorm batch
    statistics here too).
    """

    def __init__(self, model: nn.Module, layer: str | None = None, fake_relu: bool | None = None, pool: Pool = "auto"):
        super().__init__()
        from torchvision.models.feature_extraction import create_feature_extractor

        if pool not in ("auto", "avg", "flatten"):
            raise ValueError(f"pool must be 'auto', 'avg' or 'flatten', got {pool!r}")
        net, normalize = _split(model)
        penultimate, classifier = _penultimate(model)
        if layer in (None, "penultimate"):
            if penultimate is None:
                raise ValueError(f"{type(model).__name__} names no penultimate layer and wraps no single zoo classifier that does: "
                                 "pass layer= (see list_layers(model))")
            layer = penultimate
        try:
            names = list_layers(model)
        except (TypeError, RuntimeError, NotImplementedError, AttributeError) as err:
            raise _untraceable(model, err) from err
        node_name = _resolve_layer(net, layer, names)
        self.layer = layer
        self.default_pool = "avg" if layer == penultimate else "flatten"  # what pool="auto" chooses at this layer
        self.pool = self.default_pool if pool == "auto" else pool
        # the default fake ReLU is the one of the classifier whose layer this is (a wrapper's own layers: the wrapper's)
        default_fake_relu = getattr(classifier if layer == penultimate else model, "fake_relu", False)
        self.fake_relu = bool(default_fake_relu if fake_relu is None else fake_relu)
        with kept_training_flags(model):  # a model training in the caller's loop had its BatchNorm frozen, model.training still True
            try:
                self.extractor = create_feature_extractor(net.eval(), return_nodes={node_name: "features"})
            except (TypeError, RuntimeError, NotImplementedError, AttributeError) as err:
                raise _untraceable(model, err) from err
            self.normalize = normalize
            if self.fake_relu:
                self._apply_fake_relu(node_name, explicit=fake_relu is not None)
            self.eval()

    def _apply_fake_relu(self, node_name: str, explicit: bool) -> None:
        gm = self.extractor
        output = next(n for n in gm.graph.nodes if n.op == "output")
        node = output.args[0]["features"]
        if not _is_relu(node, gm):
            what = node.target if node.op != "call_module" else type(gm.get_submodule(node.target)).__name__
            warnings.warn(
                f"fake_relu=True changes nothing at layer {self.layer!r}: its last operation is {what}, not a ReLU"
                + ("" if explicit else " (the architecture's default asked for it)"),
                stacklevel=3,
            )
            self.fake_relu = False
            return
        with gm.graph.inserting_after(node):
            replacement = gm.graph.call_function(fake_relu, (node.args[0],))
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        gm.graph.lint()
        gm.recompile()
        gm.delete_all_unused_submodules()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Range check skipped inside invert.validation.hot_loop() (it would sync the device).
        check_images(x, "images", channels=3)
        if self.normalize is not None:
            x = self.normalize(x)
        features = self.extractor(x)["features"]
        if features.ndim == 4 and self.pool == "avg":
            return F.adaptive_avg_pool2d(features, 1).flatten(1)
        return features.flatten(1)

    def extra_repr(self) -> str:
        return f"layer={self.layer!r}, fake_relu={self.fake_relu}, pool={self.pool!r}"

