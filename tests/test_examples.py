"""The examples run as users run them, in their reduced (--quick) mode."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def run_example(name, *arguments, timeout=300):
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *arguments], capture_output=True,
                          text=True, timeout=timeout)


def test_train_digits_reaches_95_percent_held_out():
    result = run_example("train_digits.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    accuracy = float(re.search(r"held-out accuracy (\d\.\d+) after", result.stdout).group(1))
    assert accuracy >= 0.95


def test_imagenet_style_trains_and_validates(tmp_path):
    result = run_example("imagenet_style.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("val accuracy") == 2


def test_quickstart_saves_a_batch_grid(tmp_path):
    result = run_example("quickstart.py", "--out", str(tmp_path), "--samples", "40")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "photos_batch.png").stat().st_size > 10_000


def test_research_features_example_runs_all_three_parts():
    result = run_example("research_features.py", "--images", "96")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every pixel back: True" in result.stdout
    mix = re.search(r"under OrderOption.BALANCED: \[([\d, ]+)\]", result.stdout).group(1).split(", ")
    assert len(set(mix[:-1])) == 1  # every full batch holds the same number of raw images


def test_lightning_data_module_trains_on_beton_loaders():
    pytest.importorskip("lightning", reason="Lightning is not installed (pip install lightning)")
    result = run_example("lightning_digits.py", "--epochs", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert float(re.search(r"val accuracy (\d\.\d+) after 2 epochs", result.stdout).group(1)) >= 0.9


def test_a_loader_as_a_torch_iterable_dataset(image_file):
    import torch.utils.data

    from beton import Loader
    from beton.errors import LoaderError
    from beton.loader import BatchDataset

    with Loader(image_file, batch_size=16, num_workers=2) as loader:
        data = torch.utils.data.DataLoader(BatchDataset(loader), batch_size=None, num_workers=0)
        assert len(data) == 13
        assert torch.cat([labels for _, labels in data]).tolist() == list(range(203))
        in_workers = torch.utils.data.DataLoader(BatchDataset(loader), batch_size=None, num_workers=1)
        with pytest.raises(LoaderError, match="num_workers=0"):
            next(iter(in_workers))


def test_language_model_example_trains_on_packed_rows():
    result = run_example("language_model.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = re.findall(r"step +\d+: (\d+) rows of 129", result.stdout)
    assert rows and all(int(count) > 1 for count in rows)
    first, final = (float(v) for v in re.search(r"loss (\d+\.\d+) -> (\d+\.\d+) nats", result.stdout).groups())
    assert final < first - 2.0


def test_audio_example_classifies_random_one_second_windows():
    result = run_example("audio_clips.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "last batch (32, 8000)" in result.stdout  # one-second windows, padded where clips are shorter
    assert float(re.search(r"held-out accuracy (\d\.\d+)", result.stdout).group(1)) >= 0.9


def test_detection_example_boxes_agree_with_the_pixels(tmp_path):
    result = run_example("detection.py", "--images", "96", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert float(re.search(r"mean IoU (\d\.\d+)", result.stdout).group(1)) >= 0.9
    assert (tmp_path / "detection_batch.png").stat().st_size > 10_000


def test_ray_build_writes_shards_through_ray_and_trains_from_the_manifest():
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'beton[ray]')")
    result = run_example("ray_build.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrote 120 images in 3 shards" in result.stdout
    assert "trained 6 steps from the manifest" in result.stdout
