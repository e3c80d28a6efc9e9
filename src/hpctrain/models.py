"""The models: a small CNN for quick runs and torchvision's ResNet-18 for the classic fine-tune."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from hpctrain import HpctrainError


@dataclass(frozen=True)
class ModelInput:
    channels: int | None  # None: whatever the data has
    min_size: int | None  # images smaller than this are upsampled to it


INPUTS = {
    "cnn": ModelInput(channels=None, min_size=None),
    # Below 32 px the five stride-2 stages of ResNet-18 shrink the feature map to nothing useful.
    "resnet18": ModelInput(channels=3, min_size=32),
}


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head; any input size (global average pool)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
            )

        self.features = nn.Sequential(block(in_channels, 32), block(32, 64), nn.MaxPool2d(2), block(64, 128))
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # mean over H, W rather than AdaptiveAvgPool2d: its CUDA backward is not deterministic.
        return self.fc(self.features(x).mean(dim=(2, 3)))


def build(name: str, in_channels: int, num_classes: int, pretrained_weights: Path | None) -> nn.Module:
    """The model with a fresh `fc` head for `num_classes`; the head is what a frozen phase trains."""
    if name == "cnn":
        return SmallCNN(in_channels, num_classes)
    # Imported here, not at the top: torchvision's import (it pulls in torch._dynamo) nearly doubles the
    # start of every job of the small CNN, which never uses it.
    from torchvision.models import resnet18

    model = resnet18(weights=None)
    if pretrained_weights is not None:
        try:
            model.load_state_dict(torch.load(pretrained_weights, map_location="cpu", weights_only=True))
        except (RuntimeError, OSError, KeyError) as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise HpctrainError(
                f"--pretrained-weights {pretrained_weights}: not a resnet18 state dict ({first_line})"
            ) from None
    model.fc = nn.Linear(model.fc.in_features, num_classes)
    return model


def set_backbone_frozen(model: nn.Module, frozen: bool) -> int:
    """Freeze (or unfreeze) everything but the `fc` head; returns the number of trainable parameters."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad = not frozen or name.startswith("fc.")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
