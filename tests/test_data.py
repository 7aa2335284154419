"""Vision data pipeline: Hub-layout loading, ids, decode, augmentation, label noise, errors."""

import io
import logging
import re
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from tiny import make_image_dataset
from torch.utils.data import DataLoader
from transformers import HfArgumentParser, default_data_collator

from hf_selective_backprop.data import (
    KNOWN_DATASETS,
    BatchTransform,
    DataArguments,
    flip_labels,
    load_image_data,
)
from hf_selective_backprop.data.decode import decode_images, decode_one
from hf_selective_backprop.data.transforms import cutout, random_crop, random_hflip

# decode_one is called directly here; decode_images silences torchvision's deprecation itself.
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# The README of uoft-cs/cifar10 (and of ../shared/data/cifar10): one config, two splits.
CIFAR10_README = """---
configs:
- config_name: plain_text
  default: true
  data_files:
  - split: train
    path: plain_text/train-*.parquet
  - split: test
    path: plain_text/test-*.parquet
---
"""


def random_image(rng: np.random.Generator, size=(32, 32), mode="RGB") -> Image.Image:
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode)


def write_hub_layout(folder: Path, splits: dict[str, int], seed: int = 0, image_column="img", label_column="label"):
    """A tiny dataset in uoft-cs/cifar10's layout: README + plain_text/<split>-00000-of-00001.parquet."""
    rng = np.random.default_rng(seed)
    features = {image_column: datasets.Image()}
    if label_column is not None:
        features[label_column] = datasets.ClassLabel(names=CIFAR10_NAMES)
    for split, rows in splits.items():
        columns = {image_column: [random_image(rng) for _ in range(rows)]}
        if label_column is not None:
            columns[label_column] = [i % 10 for i in range(rows)]
        table = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
        (folder / "plain_text").mkdir(parents=True, exist_ok=True)
        table.to_parquet(str(folder / "plain_text" / f"{split}-00000-of-00001.parquet"))
    (folder / "README.md").write_text(CIFAR10_README)
    return folder


@pytest.fixture(scope="module")
def tiny_cifar(tmp_path_factory) -> Path:
    return write_hub_layout(tmp_path_factory.mktemp("hub") / "cifar10", {"train": 40, "test": 12})


def load(dataset, tmp_path, **kwargs):
    return load_image_data(DataArguments(dataset=str(dataset), cache_dir=str(tmp_path / "cache"), **kwargs))


# ---- loading ----------------------------------------------------------------------------


def test_hub_layout_folder_loads_like_the_hub_dataset(tiny_cifar, tmp_path):
    data = load(tiny_cifar, tmp_path)
    reference = datasets.load_dataset(str(tiny_cifar), cache_dir=str(tmp_path / "cache"))
    assert data.spec.name == "cifar10" and data.dataset_id == "uoft-cs/cifar10"
    assert data.label_names == CIFAR10_NAMES and data.num_labels == 10
    assert data.train.images.shape == (40, 3, 32, 32) and data.train.images.dtype == torch.uint8
    assert data.eval.images.shape == (12, 3, 32, 32)
    first = torch.from_numpy(np.array(reference["train"][0]["img"].convert("RGB"))).permute(2, 0, 1)
    assert torch.equal(data.train.images[0], first)  # PNG: lossless, so bit-exact
    assert data.train.labels.tolist() == reference["train"]["label"]
    assert data.train.transform.hflip and data.train.transform.cutout == 16
    assert data.mean == KNOWN_DATASETS["cifar10"].mean


def test_unknown_folder_gets_detected_columns_and_measured_statistics(tmp_path):
    folder = write_hub_layout(tmp_path / "my_images", {"train": 20, "test": 4})
    data = load(folder, tmp_path)
    assert data.spec.name == "custom" and data.dataset_id == str(folder.resolve())
    assert not data.train.transform.hflip and data.train.transform.cutout == 0
    pixels = data.train.images.float() / 255
    assert torch.allclose(torch.tensor(data.mean), pixels.mean((0, 2, 3)), atol=1e-4)
    # An explicit known name plus --data_dir gets that dataset's recipe.
    named = load_image_data(DataArguments(dataset="cifar10", data_dir=str(folder), cache_dir=str(tmp_path / "c")))
    assert named.spec.name == "cifar10" and named.train.transform.cutout == 16


# ---- which recipe a folder gets (issue 78) ------------------------------------------------------------

RECIPE_LOGGER = "hf_selective_backprop.data.sources"
#: Ways a dataset card names CIFAR-10: the Hub card's front matter (uoft-cs/cifar10), its title, the shared copy's.
CARDS_NAMING_CIFAR10 = {
    "pretty_name": CIFAR10_README.replace("configs:", "pretty_name: Cifar10\npaperswithcode_id: cifar-10\nconfigs:"),
    "hub title": CIFAR10_README + "\n# Dataset Card for CIFAR-10\n\n## Table of Contents\n",
    "copy title": CIFAR10_README + "\n# CIFAR-10 (local copy, JPEG-compressed)\n\nA local copy of CIFAR-10.\n",
}


def recipe_lines(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == RECIPE_LOGGER and "recipe" in record.getMessage()]


@pytest.mark.parametrize("card", sorted(CARDS_NAMING_CIFAR10))
def test_a_folder_whose_card_names_a_known_dataset_gets_its_recipe_and_says_so(card, tmp_path, caplog):
    folder = write_hub_layout(tmp_path / "my-copy", {"train": 12, "test": 4})
    (folder / "README.md").write_text(CARDS_NAMING_CIFAR10[card])
    with caplog.at_level(logging.INFO, logger=RECIPE_LOGGER):
        data = load(folder, tmp_path)
    assert data.spec.name == "cifar10" and data.dataset_id == "uoft-cs/cifar10"
    assert data.train.transform.hflip and data.train.transform.cutout == 16
    assert data.mean == KNOWN_DATASETS["cifar10"].mean
    (line,) = recipe_lines(caplog)
    message = line.getMessage()
    assert line.levelno == logging.WARNING  # inferred, not named by the user: shown without any logging set up
    assert f"{folder.resolve()}: training with the cifar10 recipe (its published mean and std, random flips, " \
           "cutout 16), as its README.md names it (" in message
    assert f"--dataset NAME --data_dir {folder} trains it with a known dataset's recipe (NAME: cifar10, cifar100, " \
           "svhn, mnist)" in message


def test_a_folder_neither_named_nor_carded_gets_the_generic_recipe_and_the_log_says_so(tmp_path, caplog):
    folder = write_hub_layout(tmp_path / "my-copy", {"train": 12, "test": 4})  # its card names only 'plain_text'
    with caplog.at_level(logging.INFO, logger=RECIPE_LOGGER):
        data = load(folder, tmp_path)
    assert data.spec.name == "custom" and not data.train.transform.hflip and data.train.transform.cutout == 0
    (line,) = recipe_lines(caplog)
    assert line.levelno == logging.WARNING
    assert line.getMessage() == (
        f"{folder.resolve()}: training with the generic recipe (mean and std measured on the training images, no "
        "flips, no cutout), as neither the folder's name nor its README.md names a known dataset. --dataset NAME "
        f"--data_dir {folder} trains it with a known dataset's recipe (NAME: cifar10, cifar100, svhn, mnist); "
        "--hflip and --cutout set its augmentation"
    )
    caplog.clear()
    (folder / "README.md").unlink()  # no card at all: the same
    with caplog.at_level(logging.INFO, logger=RECIPE_LOGGER):
        assert load(folder, tmp_path).spec.name == "custom"
    assert "generic recipe" in recipe_lines(caplog)[0].getMessage()


def test_a_card_naming_two_known_datasets_is_not_guessed_from(tmp_path, caplog):
    folder = write_hub_layout(tmp_path / "mixed", {"train": 12, "test": 4})
    (folder / "README.md").write_text(CIFAR10_README.replace("configs:", "pretty_name: MNIST\nconfigs:")
                                      + "\n# CIFAR-10\n")
    with caplog.at_level(logging.INFO, logger=RECIPE_LOGGER):
        assert load(folder, tmp_path).spec.name == "custom"
    message = recipe_lines(caplog)[0].getMessage()
    assert "names more than one known dataset, none is taken: mnist (its pretty_name 'MNIST'); cifar10 (its " \
           "title 'CIFAR-10')" in message


def test_a_recipe_the_user_names_is_logged_at_info(tmp_path, caplog):
    folder = write_hub_layout(tmp_path / "my-copy", {"train": 12, "test": 4})
    with caplog.at_level(logging.INFO, logger=RECIPE_LOGGER):
        named = load_image_data(DataArguments(dataset="cifar10", data_dir=str(folder), cache_dir=str(tmp_path / "c")))
        by_folder = load(write_hub_layout(tmp_path / "cifar10", {"train": 12, "test": 4}), tmp_path)
        chosen = load(folder, tmp_path, hflip=True, cutout=4)  # generic, but the augmentation is the user's
    assert named.spec.name == by_folder.spec.name == "cifar10" and chosen.spec.name == "custom"
    lines = recipe_lines(caplog)
    assert [line.levelno for line in lines] == [logging.INFO] * 3
    assert "training with the cifar10 recipe" in lines[0].getMessage()
    assert "as --dataset 'cifar10' names it" in lines[0].getMessage()
    assert "as the folder's name says" in lines[1].getMessage()


def test_a_copy_of_the_shared_cifar10_under_another_name_gets_the_cifar10_recipe(tmp_path):
    readme = SHARED_DATA / "cifar10" / "README.md"
    if not readme.is_file():
        pytest.skip(f"{readme} not present (the shared local copy of cifar10 is not on this machine)")
    folder = write_hub_layout(tmp_path / "my-cifar10-copy", {"train": 12, "test": 4})
    (folder / "README.md").write_text(readme.read_text())
    data = load(folder, tmp_path)
    assert data.spec.name == "cifar10" and data.train.transform.cutout == 16 and data.train.transform.hflip


def test_digits_ship_with_sklearn(tmp_path):
    data = load("digits", tmp_path)
    assert (len(data.train), len(data.eval)) == (1437, 360)
    assert data.train.images.shape[1:] == (3, 32, 32) and data.image_size == (32, 32)
    counts = torch.bincount(data.eval.labels, minlength=10)
    assert counts.min() >= 35  # stratified: 36 (or 35/37) of each digit
    assert not data.train.transform.hflip
    small = load("digits", tmp_path, max_train_samples=100, num_channels=1, image_size=16, eval_split="none")
    assert small.train.images.shape == (100, 1, 16, 16) and small.eval is None
    assert torch.equal(small.train.labels, data.train.labels[:100])  # same split, same order


@pytest.mark.parametrize("name", ["svhn", "mnist", "digits"])
def test_digit_datasets_never_flip(name):
    assert not KNOWN_DATASETS[name].hflip
    assert KNOWN_DATASETS["cifar10"].hflip and KNOWN_DATASETS["cifar100"].hflip


def test_argument_parser_reads_data_flags():
    (args,) = HfArgumentParser(DataArguments).parse_args_into_dataclasses(
        ["--dataset", "digits", "--max_train_samples", "10", "--augment", "False", "--hflip", "True", "--cutout", "4"]
    )
    assert (args.dataset, args.max_train_samples, args.augment, args.hflip, args.cutout) == (
        "digits",
        10,
        False,
        True,
        4,
    )
    with pytest.raises(ValueError, match="label_noise"):
        DataArguments(label_noise=1.0)


@pytest.mark.parametrize(
    "name, spec_name, channels",
    [("cifar10", "cifar10", 3), ("mnist", "mnist", 3)],
)
def test_real_shared_copies_load_by_path(name, spec_name, channels):
    folder = SHARED_DATA / name
    if not folder.is_dir():
        pytest.skip(f"{folder} not present (the shared local copy of {name} is not on this machine)")
    start = time.perf_counter()
    data = load_image_data(DataArguments(dataset=str(folder), max_train_samples=256, max_eval_samples=64))
    seconds = time.perf_counter() - start
    assert data.spec.name == spec_name and len(data.train) == 256 and len(data.eval) == 64
    assert data.train.images.shape[1] == channels and data.num_labels == 10
    assert data.train.index.tolist() == list(range(256))
    # Only the subset is decoded: a full decode of 50,000+ images takes several seconds.
    assert seconds < 10, f"loading a 256-image subset took {seconds:.1f}s"
    if name == "mnist":
        assert data.image_size == (28, 28) and not data.train.transform.hflip
        # Grayscale replicated to RGB, with MNIST's grayscale statistics on each channel.
        assert torch.equal(data.train.images[:, 0], data.train.images[:, 2])
        assert data.mean == (0.1307,) * 3


# ---- ids --------------------------------------------------------------------------------


def test_index_is_the_original_position_and_survives_subset_and_shuffle(tiny_cifar, tmp_path):
    full = load(tiny_cifar, tmp_path, augment=False)
    subset = load(tiny_cifar, tmp_path, augment=False, max_train_samples=25)
    assert full.train.index.dtype == torch.int64 and full.train.index.tolist() == list(range(40))
    assert subset.train.index.tolist() == list(range(25))
    assert torch.equal(subset.train.images, full.train.images[:25])
    loader = DataLoader(subset.train, batch_size=8, shuffle=True, collate_fn=default_data_collator)
    seen = []
    for batch in loader:
        ids = batch["index"]
        assert torch.equal(batch["labels"], full.train.labels[ids])
        assert torch.equal(batch["pixel_values"], full.train.transform(full.train.images[ids]))
        seen += ids.tolist()
    assert sorted(seen) == list(range(25)) and seen != sorted(seen)
    assert "index" not in full.eval[0]  # only the train split carries ids


# ---- augmentation -----------------------------------------------------------------------


def test_batches_are_normalized_float_with_int64_labels(tiny_cifar, tmp_path):
    data = load(tiny_cifar, tmp_path)
    batch = default_data_collator(data.train.__getitems__(list(range(16))))
    assert batch["pixel_values"].shape == (16, 3, 32, 32) and batch["pixel_values"].dtype == torch.float32
    assert batch["labels"].dtype == torch.int64 and batch["index"].dtype == torch.int64
    plain = default_data_collator(data.eval.__getitems__(list(range(4))))
    mean, std = torch.tensor(data.mean)[:, None, None], torch.tensor(data.std)[:, None, None]
    assert torch.allclose(plain["pixel_values"], (data.eval.images[:4].float() / 255 - mean) / std, atol=1e-5)


def test_augmentation_is_deterministic_under_a_seed(tiny_cifar, tmp_path):
    def batch(seed):
        data = load_image_data(DataArguments(dataset=str(tiny_cifar), cache_dir=str(tmp_path / "c")), seed=seed)
        return torch.stack([row["pixel_values"] for row in data.train.__getitems__(list(range(32)))])

    assert torch.equal(batch(1), batch(1))
    assert not torch.equal(batch(1), batch(2))


def test_eval_and_unaugmented_rows_have_no_randomness(tiny_cifar, tmp_path):
    data = load(tiny_cifar, tmp_path)
    assert torch.equal(data.eval[3]["pixel_values"], data.eval[3]["pixel_values"])
    assert not torch.equal(data.train[3]["pixel_values"], data.train[3]["pixel_values"])
    data.train.transform.augment = False  # the switch that turns augmentation off
    assert torch.equal(data.train[3]["pixel_values"], data.train[3]["pixel_values"])


def test_a_dataset_moved_to_a_device_shares_its_rows_and_keeps_its_ids_on_the_host():
    dataset = make_image_dataset(16)
    dataset.noisy_indices = torch.tensor([3])
    moved = dataset.to("cpu")  # tests/test_gpu.py moves one to a GPU
    assert moved.images is dataset.images and moved.index is dataset.index and moved.transform is dataset.transform
    assert torch.equal(moved.noisy_indices, dataset.noisy_indices) and moved.fingerprint() == dataset.fingerprint()


def test_workers_draw_different_augmentations_reproducibly(tmp_path):
    same_image = torch.full((64, 3, 8, 8), 200, dtype=torch.uint8)
    same_image[:, :, :, :4] = 10  # left/right halves differ: crops and flips are visible
    from hf_selective_backprop.data import ImageTensorDataset

    dataset = ImageTensorDataset(
        same_image, torch.zeros(64, dtype=torch.int64), BatchTransform((0.5,) * 3, (0.5,) * 3, augment=True, hflip=True)
    )

    def run():
        torch.manual_seed(0)
        loader = DataLoader(dataset, batch_size=32, num_workers=2, collate_fn=default_data_collator)
        return [batch["pixel_values"] for batch in loader]

    first, second = run()
    assert not torch.equal(first, second)  # the two workers do not repeat each other
    assert all(torch.equal(a, b) for a, b in zip(run(), (first, second), strict=True))


def test_random_crop_is_a_shifted_window_of_the_zero_padded_image():
    images = torch.randint(1, 256, (6, 3, 10, 12), dtype=torch.uint8)
    out = random_crop(images, 2, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(images, (2,) * 4)
    for i in range(6):
        windows = [padded[i, :, t : t + 10, s : s + 12] for t in range(5) for s in range(5)]
        assert any(torch.equal(out[i], w) for w in windows)


def test_hflip_mirrors_about_half_of_the_images():
    images = torch.arange(200 * 4, dtype=torch.float32).reshape(200, 1, 1, 4)
    out = random_hflip(images, torch.Generator().manual_seed(0))
    flipped = (out == images.flip(-1)).flatten(1).all(1)
    assert torch.equal(flipped | (out == images).flatten(1).all(1), torch.ones(200, dtype=torch.bool))
    assert 70 < int(flipped.sum()) < 130


def test_cutout_zeroes_one_square_of_the_given_side_clipped_at_borders():
    images = torch.ones(300, 3, 32, 32)
    out = cutout(images, 16, torch.Generator().manual_seed(0))
    full_squares = 0
    for image in out:
        zero = image[0] == 0
        assert torch.equal(zero, image[1] == 0) and torch.equal(zero, image[2] == 0)
        rows, cols = zero.any(1).nonzero().flatten(), zero.any(0).nonzero().flatten()
        height, width = rows.numel(), cols.numel()
        assert 1 <= height <= 16 and 1 <= width <= 16
        assert zero.sum() == height * width  # one rectangle
        assert zero[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].all()
        inside = rows[0] > 0 and rows[-1] < 31 and cols[0] > 0 and cols[-1] < 31
        if inside:
            assert height == width == 16
            full_squares += 1
    assert full_squares > 50


# ---- label noise ------------------------------------------------------------------------


def test_label_noise_flips_an_exact_seeded_set_to_other_classes():
    labels = torch.arange(1000) % 10
    noisy, flipped = flip_labels(labels, 0.2, 10, seed=3)
    assert flipped.numel() == 200 and torch.equal(flipped, flipped.sort().values)
    assert (noisy[flipped] != labels[flipped]).all()
    unchanged = torch.ones(1000, dtype=torch.bool)
    unchanged[flipped] = False
    assert torch.equal(noisy[unchanged], labels[unchanged])
    again, flipped_again = flip_labels(labels, 0.2, 10, seed=3)
    assert torch.equal(again, noisy) and torch.equal(flipped_again, flipped)
    assert not torch.equal(flip_labels(labels, 0.2, 10, seed=4)[1], flipped)
    shifts = (noisy[flipped] - labels[flipped]) % 10
    assert set(shifts.tolist()) == set(range(1, 10))  # every wrong class is reachable
    assert flip_labels(labels, 0.0, 10, seed=0)[1].numel() == 0
    assert flip_labels(labels[:7], 0.1, 10, seed=0)[1].numel() == 1  # round(0.7)


def test_label_noise_on_the_train_split_records_flipped_ids(tiny_cifar, tmp_path):
    clean = load(tiny_cifar, tmp_path, max_train_samples=30)
    noisy = load(tiny_cifar, tmp_path, max_train_samples=30, label_noise=0.1, label_noise_seed=5)
    ids = noisy.train.noisy_indices
    assert ids.tolist() == torch.nonzero(noisy.train.labels != clean.train.labels).flatten().tolist()
    assert ids.numel() == 3 and clean.train.noisy_indices.numel() == 0
    assert torch.equal(noisy.eval.labels, clean.eval.labels)  # evaluation stays clean


# ---- errors -----------------------------------------------------------------------------


def test_bad_columns_name_the_flag_and_list_the_columns(tiny_cifar, tmp_path):
    with pytest.raises(ValueError, match=r"--image_column 'image'.*\['img', 'label'\]"):
        load(tiny_cifar, tmp_path, image_column="image")
    with pytest.raises(ValueError, match=r"--label_column 'fine_label'.*\['img', 'label'\]"):
        load(tiny_cifar, tmp_path, label_column="fine_label")
    with pytest.raises(ValueError, match=r"does not hold images.*--image_column"):
        load(tiny_cifar, tmp_path, image_column="label")


def test_dataset_without_labels_is_refused(tmp_path):
    folder = write_hub_layout(tmp_path / "unlabeled", {"train": 4, "test": 2}, label_column=None)
    with pytest.raises(ValueError, match=r"no label column found; columns found: \['img'\]; pass --label_column"):
        load(folder, tmp_path)


def test_missing_splits_name_the_flag_and_list_the_splits(tiny_cifar, tmp_path):
    with pytest.raises(ValueError, match=r"--train_split 'training' not found .*\['test', 'train'\]"):
        load(tiny_cifar, tmp_path, train_split="training")
    with pytest.raises(ValueError, match=r"--eval_split 'validation' not found .*\['test', 'train'\]"):
        load(tiny_cifar, tmp_path, eval_split="validation")


def test_unknown_dataset_and_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="neither a known dataset.*cifar10, cifar100, svhn, mnist, digits"):
        load("imagenet21k", tmp_path)
    with pytest.raises(ValueError, match="neither a known dataset"):
        load(tmp_path / "does-not-exist", tmp_path)
    with pytest.raises(ValueError, match="--data_dir .*no such folder"):
        load_image_data(DataArguments(dataset="cifar10", data_dir=str(tmp_path / "nowhere")))


# ---- decoding ---------------------------------------------------------------------------


def encoded(image: Image.Image, fmt: str = "PNG") -> dict:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return {"bytes": buffer.getvalue(), "path": None}


def test_decode_converts_grayscale_rgba_and_palette_images():
    rgb = random_image(np.random.default_rng(0), size=(6, 5))
    reference = torch.from_numpy(np.array(rgb)).permute(2, 0, 1)
    for mode in ("RGBA", "P", "L", "1", "LA"):
        image = rgb.convert(mode)
        for fmt in ("PNG", "BMP", "GIF"):
            if fmt == "BMP" and mode in ("LA",):
                continue
            out = decode_one(encoded(image, fmt), 3)
            expected = torch.from_numpy(np.array(Image.open(io.BytesIO(encoded(image, fmt)["bytes"])).convert("RGB")))
            assert out.shape == (3, 5, 6) and out.dtype == torch.uint8, (mode, fmt)
            assert (out.int() - expected.permute(2, 0, 1).int()).abs().max() <= 1, (mode, fmt)
            assert decode_one(encoded(image, fmt), 1).shape == (1, 5, 6)
    assert torch.equal(decode_one(encoded(rgb.convert("RGBA")), 3), reference)  # alpha dropped


def test_decode_reads_files_by_path_and_resizes_mixed_sizes(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "image.jpg"
    random_image(rng, size=(20, 10)).save(path)
    cells = [encoded(random_image(rng, size=(16, 16))), {"bytes": None, "path": str(path)}]
    images, resized = decode_images(cells, 3)
    assert images.shape == (2, 3, 16, 16) and resized == 1
    images, resized = decode_images(cells, 1, size=(8, 8))
    assert images.shape == (2, 1, 8, 8) and resized == 2


def test_folder_of_mixed_modes_and_sizes_loads(tmp_path):
    rng = np.random.default_rng(2)
    images = [
        random_image(rng, (32, 32)),
        random_image(rng, (32, 32), "L"),
        random_image(rng, (40, 30), "RGBA"),
        random_image(rng, (32, 32), "P"),
    ]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    folder = tmp_path / "mixed"
    for split in ("train", "test"):
        table = datasets.Dataset.from_dict({"image": images, "label": [0, 1, 0, 1]}, features=features)
        (folder / "data").mkdir(parents=True, exist_ok=True)
        table.to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))
    data = load(folder, tmp_path)
    assert data.train.images.shape == (4, 3, 32, 32) and data.eval.images.shape == (4, 3, 32, 32)
    assert torch.equal(data.train.images[1, 0], data.train.images[1, 1])  # grayscale -> equal channels
    small = load(folder, tmp_path, image_size=24, num_channels=1)
    assert small.train.images.shape == (4, 1, 24, 24) and len(small.mean) == 1


def test_decode_scales_16_bit_png_to_8_bit():
    deep = np.array([[0, 256, 65535]], dtype=np.uint16)
    out = decode_one(encoded(Image.fromarray(deep)), 1)
    assert out.dtype == torch.uint8 and out.flatten().tolist() == [0, 1, 255]


# ---- hostile inputs: errors name the split, column and row, before anything is decoded --------


def write_rows(folder: Path, splits: dict[str, tuple[list, list]], label_feature=None) -> Path:
    """A Hub-layout folder whose splits hold the given (image cells, labels); integer labels by default."""
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for split, (images, labels) in splits.items():
        table = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
        if label_feature is not None:
            # An Arrow cast of the column alone keeps ids outside the names, as a damaged file would.
            table = table.cast_column("label", label_feature)
        table.to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))
    return folder


def png_cells(count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [encoded(random_image(rng, size=(8, 8))) for _ in range(count)]


@pytest.fixture
def no_decoding(monkeypatch):
    """Fails the test if any image is decoded: label and split errors must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("images were decoded before the error")

    monkeypatch.setattr("hf_selective_backprop.data.datasets.decode_images", refuse)


def stray_label_folder(tmp_path) -> Path:
    """Integer labels 0..9, plus one 11 at train row 7 (a typo: there is no class 10)."""
    labels = [i % 10 for i in range(30)]
    labels[7] = 11
    return write_rows(tmp_path / "stray", {"train": (png_cells(30), labels), "test": (png_cells(10), list(range(10)))})


def test_a_stray_integer_label_is_an_error_naming_its_row_not_an_extra_class(tmp_path, no_decoding):
    folder = stray_label_folder(tmp_path)
    with pytest.raises(ValueError) as error:
        load(folder, tmp_path)
    message = str(error.value)
    assert "label column 'label'" in message and "not the contiguous 0..11: 10 never occurs" in message
    assert "--train_split 'train': row 7 = 11 (1 row)" in message and "--eval_split" not in message
    assert "pass --num_labels 12" in message
    # The user's own class count: 11 is then outside it, reported with its row.
    with pytest.raises(ValueError, match=r"--train_split 'train', label column 'label': labels must be class ids in "
                       r"\[0, 9\] \(10 classes, from --num_labels 10: .*row 7 = 11 \(1 row\); fix or drop those "
                       r"rows, or raise --num_labels"):
        load(folder, tmp_path, num_labels=10)


def test_num_labels_declares_classes_that_have_no_example(tmp_path):
    data = load(stray_label_folder(tmp_path), tmp_path, num_labels=12)
    assert data.num_labels == 12 and data.label_names == [str(i) for i in range(12)]
    assert data.train.labels[7] == 11


def test_inferred_class_count_is_logged_and_counts_rows_beyond_the_subset(tmp_path, caplog):
    folder = write_rows(tmp_path / "ints", {"train": (png_cells(12), [i % 4 for i in range(12)]),
                                            "test": (png_cells(4), [0, 1, 2, 5])})
    with pytest.raises(ValueError, match=r"4 never occurs.*--eval_split 'test': row 3 = 5 \(1 row\)"):
        load(folder, tmp_path)
    caplog.set_level("INFO", logger="hf_selective_backprop.data.labels")
    data = load(folder, tmp_path, eval_split="none", max_train_samples=3)
    assert data.num_labels == 4  # the first 3 rows hold 0..2, the split 0..3
    assert "label column 'label': 4 classes inferred from its integer ids 0..3 in --train_split 'train'" in caplog.text


def test_labels_outside_the_classlabel_names_name_split_row_and_names(tmp_path, no_decoding):
    names = datasets.ClassLabel(names=["cat", "dog"])
    folder = write_rows(tmp_path / "named", {"train": (png_cells(6), [0, 1, 0, 1, 0, 1]),
                                             "test": (png_cells(4), [0, -1, 1, 5])}, names)
    with pytest.raises(ValueError, match=r"--eval_split 'test', label column 'label': labels must be class ids in "
                       r"\[0, 1\] \(2 classes, from the ClassLabel names of column 'label': cat, dog\), found "
                       r"row 1 = -1, row 3 = 5 \(2 rows\); fix or drop those rows$"):
        load(folder, tmp_path)
    with pytest.raises(ValueError, match=r"--num_labels 3 disagrees with label column 'label', which declares 2 "
                       r"classes \(cat, dog\); drop --num_labels"):
        load(folder, tmp_path, num_labels=3)


def test_a_missing_label_names_its_row(tmp_path, no_decoding):
    folder = write_rows(tmp_path / "holes", {"train": (png_cells(4), [0, 1, None, 1]), "test": (png_cells(2), [0, 1])})
    with pytest.raises(ValueError, match=r"--train_split 'train', label column 'label': no label at row 2; fix or "
                       r"drop that row"):
        load(folder, tmp_path)


def test_num_labels_must_be_positive_and_parses():
    with pytest.raises(ValueError, match="--num_labels must be >= 1, got 0"):
        DataArguments(num_labels=0)
    (args,) = HfArgumentParser(DataArguments).parse_args_into_dataclasses(["--num_labels", "12"])
    assert args.num_labels == 12


@pytest.mark.parametrize(
    "cell, expected",
    [
        ({"bytes": b"\x00\x01\x02\x03\x04\x05\x06\x07\x08", "path": None},
         r"it starts with b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07'\.\.: not PNG/JPEG/GIF/BMP/TIFF/WebP; "),
        ("truncated PNG", r"it starts with b'\\x89PNG\\r\\n\\x1a\\n'\.\., a PNG header, but its 40 bytes do not "
                          r"decode \(RuntimeError: "),
        ({"bytes": b"", "path": None}, r"it is empty \(0 bytes\); "),
    ],
    ids=["not_an_image", "truncated_png", "empty"],
)
def test_a_corrupt_image_names_its_row_column_and_what_its_bytes_are(cell, expected, tmp_path):
    cells = png_cells(5)
    cells[3] = {"bytes": cells[3]["bytes"][:40], "path": None} if cell == "truncated PNG" else cell
    folder = write_rows(tmp_path / "broken", {"train": (cells, [0, 1, 0, 1, 0]), "test": (png_cells(2), [0, 1])})
    with pytest.raises(ValueError) as error:
        load(folder, tmp_path)
    message = str(error.value)
    assert message.startswith(f"{folder.resolve()} [train], image column 'image': the image at row 3 cannot be decoded")
    assert re.search(expected, message), message
    assert message.endswith("fix or drop that row")


def test_unreadable_cells_name_their_row(tmp_path):
    cells = png_cells(3)
    missing = {"bytes": None, "path": str(tmp_path / "missing.png")}
    with pytest.raises(ValueError, match=r"^here: row 1 refers to the file '.*missing\.png', which cannot be read"):
        decode_images([cells[0], missing, cells[2]], 3, where="here")
    with pytest.raises(ValueError, match=r"^images: row 2 holds no image \(neither bytes nor a path\)"):
        decode_images([cells[0], cells[1], None], 3)


def test_a_stray_label_one_past_the_classes_is_warned_of_by_row(tmp_path, caplog):
    """10 among 0..9 is contiguous, so it adds an 11th class: the warning names the class and its row."""
    labels = [i % 10 for i in range(300)]
    labels[7] = 10
    folder = write_rows(tmp_path / "stray10", {"train": (png_cells(300), labels),
                                               "test": (png_cells(10), list(range(10)))})
    with caplog.at_level(logging.WARNING, logger="hf_selective_backprop.data.labels"):
        data = load(folder, tmp_path)
    assert data.num_labels == 11
    warned = [r.getMessage() for r in caplog.records if "a stray label?" in r.getMessage()]
    assert len(warned) == 1 and "class(es) 10 have 1 example(s) against a median of 31" in warned[0]
    assert "--train_split 'train': row 7 = 10 (1 row)" in warned[0]
