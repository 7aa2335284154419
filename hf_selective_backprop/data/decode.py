"""Decode encoded images once into one uint8 (N, C, H, W) tensor.

Training then never touches PIL: on a 2-core machine per-example PIL work can cost more
than the model step and would hide what selection saves.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as F

_JPEG_OR_PNG = (b"\xff\xd8", b"\x89PNG")


def decode_images(
    cells: Sequence[dict], channels: int, size: tuple[int, int] | None = None
) -> tuple[torch.Tensor, int]:
    """Decode `datasets.Image(decode=False)` cells (``{"bytes", "path"}``).

    Grayscale, RGBA and palette images are converted to ``channels`` (1 or 3). Every image
    is resized to ``size`` (H, W), by default the first image's size, so a dataset of mixed
    sizes still stacks. Returns the images and how many of them were resized.
    """
    if not cells:
        raise ValueError("no images to decode")
    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its decoders in favour of TorchCodec and warns on each call.
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        first = decode_one(cells[0], channels)
        height, width = size or tuple(first.shape[1:])
        out = torch.empty((len(cells), channels, height, width), dtype=torch.uint8)
        resized = 0
        for row, cell in enumerate(cells):
            image = first if row == 0 else decode_one(cell, channels)
            if image.shape[1:] != (height, width):
                image = F.resize(image, [height, width], antialias=True)
                resized += 1
            out[row] = image
    return out, resized


def decode_one(cell: dict, channels: int) -> torch.Tensor:
    """One image as uint8 (channels, H, W)."""
    data = cell.get("bytes")
    if data is None:
        with open(cell["path"], "rb") as file:
            data = file.read()
    if data[:4].startswith(_JPEG_OR_PNG):
        # libjpeg-turbo/libpng through torchvision: the same pixels as PIL, ~3x faster on small images.
        mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
        image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode)
        if image.dtype != torch.uint8:  # 16-bit PNG
            image = F.to_dtype(image, torch.uint8, scale=True)
        return image
    with Image.open(io.BytesIO(data)) as pil:
        if pil.mode == "P" and "transparency" in pil.info:
            pil = pil.convert("RGBA")  # PIL's route for palettes with a transparent entry
        array = torch.from_numpy(np.array(pil.convert("RGB" if channels == 3 else "L")))
    return array.permute(2, 0, 1) if array.ndim == 3 else array.unsqueeze(0)
