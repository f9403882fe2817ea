"""The examples run as users run them, in their reduced (--quick) mode."""

from __future__ import annotations

import os
import re
import subprocess
import sys

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
