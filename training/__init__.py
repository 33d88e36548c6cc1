"""Where models come from: data sets, the model zoo, checkpoint import, the representation wrapper,
training recipes and evaluation.

Quick start::

    from training import load_dataset, build_model, Representation
    data = load_dataset("digits", "test")                     # uint8 (N, 3, 32, 32) + labels
    model = build_model("resnet18", "cifar10", checkpoint="robust.pt")   # any supported format
    features = Representation(model)(data.float_images()[:8])            # (8, 512) penultimate
"""
from .checkpoints import CheckpointError, load_into, read_checkpoint, save_checkpoint
from .data import DataNotFoundError, ImageSet, dataset_stats, load_dataset, load_image_folder
from .models import Classifier, build_model, list_models
from .representation import Representation, list_layers

__all__ = [
    "CheckpointError",
    "Classifier",
    "DataNotFoundError",
    "ImageSet",
    "Representation",
    "build_model",
    "dataset_stats",
    "list_layers",
    "list_models",
    "load_dataset",
    "load_image_folder",
    "load_into",
    "read_checkpoint",
    "save_checkpoint",
]

# Training recipes, attacks and evaluation: `python -m training model=... data=... train=RECIPE`.
from .attacks import ThreatModel, fgsm, pgd  # noqa: E402
from .evaluate import MaskingReport, clean_accuracy, gradient_masking_report, robust_accuracy  # noqa: E402
from .recipes import RECIPES, build_recipe, linear_probe  # noqa: E402
from .trainer import TrainingDiverged, TrainResult, train  # noqa: E402

__all__ += [
    "MaskingReport",
    "RECIPES",
    "ThreatModel",
    "TrainResult",
    "TrainingDiverged",
    "build_recipe",
    "clean_accuracy",
    "fgsm",
    "gradient_masking_report",
    "linear_probe",
    "pgd",
    "robust_accuracy",
    "train",
]
