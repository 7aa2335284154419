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

from .._optional import require

require("torchvision", "image decoding (hf_selective_backprop.data)")
require("PIL", "image decoding (hf_selective_backprop.data)")

from PIL import Image  # noqa: E402
from torchvision.io import ImageReadMode, decode_image  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

_JPEG_OR_PNG = (b"\xff\xd8", b"\x89PNG")
# File signatures, to tell a damaged image of a known format from bytes that are no image at all.
_SIGNATURES = (
    (b"\x89PNG", "PNG"),
    (b"\xff\xd8", "JPEG"),
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"RIFF", "WebP"),
)


def decode_images(
    cells: Sequence[dict | None], channels: int, size: tuple[int, int] | None = None, where: str = "images"
) -> tuple[torch.Tensor, int]:
    """Decode `datasets.Image(decode=False)` cells (``{"bytes", "path"}``).

    Grayscale, RGBA and palette images are converted to ``channels`` (1 or 3). Every image
    is resized to ``size`` (H, W), by default the first image's size, so a dataset of mixed
    sizes still stacks. Returns the images and how many of them were resized. A cell that
    cannot be read or decoded raises a ValueError naming ``where`` and its row.
    """
    if not cells:
        raise ValueError("no images to decode")
    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its decoders in favour of TorchCodec and warns on each call.
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        first = _decode_row(cells, 0, channels, where)
        height, width = size or tuple(first.shape[1:])
        out = torch.empty((len(cells), channels, height, width), dtype=torch.uint8)
        resized = 0
        for row in range(len(cells)):
            image = first if row == 0 else _decode_row(cells, row, channels, where)
            if image.shape[1:] != (height, width):
                image = F.resize(image, [height, width], antialias=True)
                resized += 1
            out[row] = image
    return out, resized


def _decode_row(cells: Sequence[dict | None], row: int, channels: int, where: str) -> torch.Tensor:
    cell = cells[row] or {}
    if cell.get("bytes") is None and cell.get("path") is None:
        raise ValueError(f"{where}: row {row} holds no image (neither bytes nor a path); fix or drop that row")
    try:
        data = _read(cell)
    except OSError as error:
        raise ValueError(
            f"{where}: row {row} refers to the file {cell['path']!r}, which cannot be read ({error})"
        ) from error
    try:
        return _decode_bytes(data, channels)
    # PIL, libpng and libjpeg fail in many ways (UnidentifiedImageError, OSError, SyntaxError,
    # RuntimeError...); any of them means this row's image is unusable.
    except Exception as error:
        raise ValueError(
            f"{where}: the image at row {row} cannot be decoded: {_describe(data, error)}; fix or drop that row"
        ) from error


def _describe(data: bytes, error: Exception) -> str:
    if not data:
        return "it is empty (0 bytes)"
    start = f"it starts with {data[:8]!r}{'..' if len(data) > 8 else ''}"
    known = next((kind for signature, kind in _SIGNATURES if data.startswith(signature)), None)
    if known is None:
        return f"{start}: not {'/'.join(dict.fromkeys(kind for _, kind in _SIGNATURES))}"
    # Only here does the decoder's own message add something (where the damage is).
    return f"{start}, a {known} header, but its {len(data)} bytes do not decode ({type(error).__name__}: {error})"


def _read(cell: dict) -> bytes:
    data = cell.get("bytes")
    if data is None:
        with open(cell["path"], "rb") as file:
            data = file.read()
    return data


def decode_one(cell: dict, channels: int) -> torch.Tensor:
    """One image as uint8 (channels, H, W)."""
    return _decode_bytes(_read(cell), channels)


def _decode_bytes(data: bytes, channels: int) -> torch.Tensor:
    """One encoded image (PNG, JPEG or anything PIL reads) as uint8 (channels, H, W)."""
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
