"""``convert imagefolder`` on folders as people have them: every format, every kind of bad file, odd layouts."""

from __future__ import annotations

import io
import json
import os

import cv2
import numpy as np
import pytest
import simplejpeg
from PIL import Image

import beton
import beton.convert
from beton.tools.convert import ConversionError, ImageFolder
from beton.tools.sample_photos import photo_crop
from beton.codecs.jpeg_restarts import with_restart_markers

from cli_runs import run_cli


def photo(index: int, height: int = 36, width: int = 44) -> np.ndarray:
    return photo_crop(index, height, width)


def encoded(image, form: str, **options) -> bytes:
    """An array (or a PIL image, for modes arrays do not carry: palette, CMYK) as a file of format ``form``."""
    buffer = io.BytesIO()
    (image if isinstance(image, Image.Image) else Image.fromarray(image)).save(buffer, form, **options)
    return buffer.getvalue()


def jpeg(index: int, **size) -> bytes:
    return simplejpeg.encode_jpeg(photo(index, **size), quality=90)


def png16(index: int) -> bytes:
    wide = photo(index).astype(np.uint16) * 257 + np.uint16(index)  # every 16-bit value distinct from 8-bit ones
    ok, data = cv2.imencode(".png", cv2.cvtColor(wide, cv2.COLOR_RGB2BGR))
    return data.tobytes()


def rgba(index: int) -> np.ndarray:
    image = photo(index)
    alpha = (np.arange(image.shape[0] * image.shape[1]) % 256).astype(np.uint8).reshape(image.shape[:2])
    return np.dstack([image, alpha])


def pil_rgb(data: bytes) -> np.ndarray:
    """An independent decoder's RGB: what torchvision's PIL loader gives."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


# name -> (file name, bytes): one of every format and colour layout an image folder may hold
FORMATS = {
    "jpeg": ("a.jpg", jpeg(1)),
    "jpeg-upper-extension": ("b.JPEG", jpeg(2)),
    "png": ("c.png", encoded(photo(3), "PNG")),
    "png-named-jpg": ("d.jpg", encoded(photo(4), "PNG")),
    "bmp": ("e.bmp", encoded(photo(5), "BMP")),
    "tiff": ("f.tiff", encoded(photo(6), "TIFF")),
    "webp-lossless": ("g.webp", encoded(photo(7), "WEBP", lossless=True)),
    "ppm": ("h.ppm", encoded(photo(8), "PPM")),
    "pgm-grey": ("i.pgm", encoded(photo(9)[:, :, 0], "PPM")),
    "grey-png": ("j.png", encoded(photo(10)[:, :, 1], "PNG")),
    "palette-png": ("k.png", encoded(Image.fromarray(photo(11)).convert("P"), "PNG")),
    "rgba-png": ("l.png", encoded(rgba(12), "PNG")),
    "png16": ("m.png", png16(13)),
    "cmyk-jpeg": ("n.jpg", encoded(Image.fromarray(photo(14)).convert("CMYK"), "JPEG")),
    "grey-jpeg": ("o.jpg", simplejpeg.encode_jpeg(np.ascontiguousarray(photo(15)[:, :, :1]), colorspace="GRAY")),
    "non-ascii-name": ("ünïcödé 写真.png", encoded(photo(16), "PNG")),
}
# the RGB pixels each file should be stored as (write_mode="lossless"): PIL's, except where PIL's RGB conversion
# is not a faithful one (16 bits: PIL clips to 255; CMYK: inversion conventions differ) and JPEGs (exact only
# for libjpeg-turbo's own decode)
EXACT = {name for name in FORMATS if name not in ("png16", "cmyk-jpeg")}


@pytest.fixture(scope="module")
def format_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats") / "train"
    for number, (name, (file, data)) in enumerate(FORMATS.items()):
        folder = root / f"class{number % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / file).write_bytes(data)
    return root


def stored_by_file(path, root) -> dict[str, tuple[np.ndarray, int, bytes]]:
    with beton.Reader(path) as reader:
        folder = ImageFolder(root)
        return {os.path.basename(file): (reader[i][0], reader[i][1], bytes(reader.payload(i, "image")))
                for i, (file, _) in enumerate(folder.samples)}


def test_every_format_is_read_by_content_and_stored_exactly_losslessly(format_folder, tmp_path):
    report = beton.convert.imagefolder(format_folder, tmp_path / "l.beton", write_mode="lossless", num_workers=2,
                                       progress=False)
    assert report.num_samples == len(FORMATS) and not report.skipped
    stored = stored_by_file(tmp_path / "l.beton", format_folder)
    for name, (file, data) in FORMATS.items():
        image, label, _ = stored[file]
        assert image.shape[2] == 3 and image.dtype == np.uint8, name
        if name in EXACT:
            np.testing.assert_array_equal(image, pil_rgb(data), err_msg=name)
    np.testing.assert_array_equal(stored["m.png"][0], (photo(13).astype(np.int64) * 257 + 13 + 128) // 257)
    cmyk = stored["n.jpg"][0].astype(int)
    assert np.abs(cmyk - photo(14).astype(int)).mean() < 12  # CMYK -> RGB through OpenCV, close to the photo
    assert "1 sample had an alpha channel, dropped" in " ".join(report.notes)
    assert "1 sample had 16-bit samples, reduced to 8 bits" in " ".join(report.notes)


def test_jpeg_files_are_stored_as_they_are_and_others_encoded(format_folder, tmp_path):
    report = beton.convert.imagefolder(format_folder, tmp_path / "j.beton", num_workers=0, progress=False)
    lossless = {"png", "png-named-jpg", "bmp", "tiff", "ppm", "pgm-grey", "grey-png", "palette-png", "rgba-png",
                "png16", "non-ascii-name"}  # by content; WebP may be lossy, so it is not counted
    assert f"{len(lossless)} samples came from a lossless file (PNG, BMP, TIFF, PNM), stored as a lossy JPEG" in \
        " ".join(report.notes)
    beton.convert.imagefolder(format_folder, tmp_path / "k.beton", num_workers=0, progress=False,
                              restart_markers=False)
    stored = stored_by_file(tmp_path / "j.beton", format_folder)
    verbatim = stored_by_file(tmp_path / "k.beton", format_folder)
    for name, (file, data) in FORMATS.items():
        image, _, payload = stored[file]
        if data[:3] == b"\xff\xd8\xff" and name != "cmyk-jpeg":
            assert verbatim[file][2] == data, name  # byte for byte: no generation loss
            assert payload == with_restart_markers(data), name  # the same coefficients, with restart markers
        else:
            assert payload[:3] == b"\xff\xd8\xff" and payload != data, name
            error = np.abs(image.astype(int) - pil_rgb(data).astype(int)).mean()  # JPEG-encoded, 4:2:0
            assert error < (20 if name == "palette-png" else 10), name  # a dithered palette is JPEG's worst case
    assert beton.verify(tmp_path / "j.beton").num_samples == len(FORMATS)


def test_labels_and_metadata_follow_the_sorted_class_folders(format_folder, tmp_path):
    report = beton.convert.imagefolder(format_folder, tmp_path / "m.beton", num_workers=0, progress=False,
                                       metadata={"license": "CC0"})
    with beton.Reader(tmp_path / "m.beton") as reader:
        metadata = reader.metadata
        labels = [reader[i][1] for i in range(len(reader))]
    assert metadata == {"classes": {"label": ["class0", "class1", "class2"]}, "license": "CC0",
                        "source": {"format": "imagefolder", "root": str(format_folder)},
                        "converted_by": f"beton {beton.__version__}"}
    assert labels == sorted(labels) and report.metadata == metadata


def torchvision_order(root) -> list[tuple[str, int]]:
    """torchvision.datasets.folder.make_dataset's order, written out (torchvision is not installed)."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    found = []
    for label, name in enumerate(classes):
        for directory, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for file in sorted(files):
                if file.lower().endswith((".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")):
                    found.append((os.path.join(directory, file), label))
    return found


def test_order_matches_torchvision_through_subfolders_and_links(tmp_path):
    root = tmp_path / "train"
    for relative in ("b/x.jpg", "b/sub/y.jpg", "b/sub-2/z.jpg", "b/sub/deeper/w.jpg", "a/Q.PNG", "a/é.jpg",
                     "c/10.jpg", "c/9.jpg", "elsewhere/linked.jpg"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(jpeg(len(relative)))
    os.symlink(root / "elsewhere", root / "c" / "link-to-folder")
    os.symlink(root / "b" / "x.jpg", root / "a" / "link-to-file.jpg")
    folder = ImageFolder(root)
    assert folder.samples == torchvision_order(root)
    assert folder.classes == ["a", "b", "c", "elsewhere"]


def test_hidden_entries_link_loops_and_other_files_are_left_out_and_counted(tmp_path):
    root = tmp_path / "train"
    (root / "cat" / ".ipynb_checkpoints").mkdir(parents=True)
    (root / "cat" / ".ipynb_checkpoints" / "x.jpg").write_bytes(jpeg(1))
    (root / "cat" / "._photo.jpg").write_bytes(b"\0\5\26\7 AppleDouble")
    (root / "cat" / "photo.jpg").write_bytes(jpeg(2))
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / ".hidden-class").mkdir()
    os.symlink(root / "cat", root / "cat" / "loop")
    report = beton.convert.imagefolder(root, tmp_path / "h.beton", num_workers=0, progress=False)
    assert report.num_samples == 1 and report.metadata["classes"] == {"label": ["cat"]}
    assert sorted(report.notes) == ["1 files without an image extension left out",
                                    "1 symbolic links to a folder already listed left out",
                                    "3 hidden entries (names starting with a dot) left out"]


def bad_folder(root):
    """Good and bad files in two classes; returns {file name: what its reason must say} of the bad ones."""
    (root / "cat").mkdir(parents=True)
    (root / "dog").mkdir()
    for k in range(3):
        (root / "cat" / f"good{k}.jpg").write_bytes(jpeg(k))
        (root / "dog" / f"good{k}.png").write_bytes(encoded(photo(10 + k), "PNG"))
    whole = jpeg(20, height=64, width=80)
    (root / "cat" / "truncated.jpg").write_bytes(whole[: len(whole) * 4 // 5])
    corrupt = bytearray(jpeg(3, height=64, width=80))  # damage libjpeg notices (much damage decodes to garbage)
    middle = len(corrupt) // 2
    corrupt[middle : middle + 40] = bytes(b ^ 0x55 for b in corrupt[middle : middle + 40])
    (root / "cat" / "corrupt.jpg").write_bytes(bytes(corrupt))
    (root / "cat" / "empty.jpg").write_bytes(b"")
    (root / "cat" / "page.jpg").write_bytes(b"<!DOCTYPE html><html>not found</html>")
    png = encoded(photo(22), "PNG")
    (root / "dog" / "truncated.png").write_bytes(png[: len(png) // 2])
    (root / "dog" / "noise.webp").write_bytes(b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(range(40)))
    os.symlink(root / "dog" / "moved-away.jpg", root / "dog" / "broken-link.jpg")
    return {"truncated.jpg": "JPEG is truncated or corrupt: Premature end of JPEG file",
            "corrupt.jpg": "JPEG is truncated or corrupt: Corrupt JPEG data",
            "empty.jpg": "the file is empty",
            "page.jpg": "not an image in a format beton reads (it starts with b'<!DOCTYPE html><')",
            "truncated.png": "PNG data cannot be decoded (truncated or corrupt)",
            "noise.webp": "WebP header cannot be read: its VP8 chunk does not start with a key frame",
            "broken-link.jpg": "broken symbolic link (to "}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_reports_every_bad_file_with_its_reason(tmp_path, num_workers):
    reasons = bad_folder(tmp_path / "train")
    report = beton.convert.imagefolder(tmp_path / "train", tmp_path / "s.beton", on_error="skip",
                                       num_workers=num_workers, progress=False)
    skipped = {os.path.basename(item.source): item.reason for item in report.skipped}
    assert set(skipped) == set(reasons)
    for name, expected in reasons.items():
        assert expected in skipped[name], (name, skipped[name])
    assert all(os.path.isabs(item.source) or item.source.startswith(str(tmp_path)) for item in report.skipped)
    with beton.Reader(tmp_path / "s.beton") as reader:
        assert len(reader) == 6 and [reader[i][1] for i in range(6)] == [0, 0, 0, 1, 1, 1]
        for k in range(3):
            assert bytes(reader.payload(k, "image")) == with_restart_markers(jpeg(k))
    beton.verify(tmp_path / "s.beton")


def test_a_kept_jpeg_is_decoded_once_to_check_it(tmp_path, monkeypatch):
    """The converter's strict check is the one the restart-marker transcode relies on: not a second decode."""
    root = tmp_path / "train"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "a.jpg").write_bytes(jpeg(1, height=64, width=80))
    decodes = []
    real_decode = simplejpeg.decode_jpeg
    monkeypatch.setattr(simplejpeg, "decode_jpeg", lambda *args, **kwargs: decodes.append(1) or
                        real_decode(*args, **kwargs))
    beton.convert.imagefolder(root, tmp_path / "s.beton", num_workers=0, progress=False)
    monkeypatch.undo()
    assert len(decodes) == 1
    with beton.Reader(tmp_path / "s.beton") as reader:
        assert bytes(reader.payload(0, "image")) == with_restart_markers(jpeg(1, height=64, width=80))
        assert bytes(reader.payload(0, "image")) != jpeg(1, height=64, width=80)  # markers were added


def test_fail_names_the_first_bad_file_and_leaves_the_target_alone(tmp_path):
    bad_folder(tmp_path / "train")
    target = tmp_path / "out.beton"
    target.write_bytes(b"an older file")
    with pytest.raises(ConversionError, match=r"train/cat/corrupt.jpg: field 'image': JPEG is truncated or corrupt"):
        beton.convert.imagefolder(tmp_path / "train", target, num_workers=0, progress=False)
    assert target.read_bytes() == b"an older file"


def test_the_command_prints_the_report_and_exits_0_or_1(tmp_path):
    reasons = bad_folder(tmp_path / "train")
    failed = run_cli("convert", "imagefolder", tmp_path / "train", tmp_path / "f.beton", "--num-workers", "0")
    assert failed.returncode == 1 and "corrupt.jpg" in failed.stderr and "--on-error skip" in failed.stderr
    assert not (tmp_path / "f.beton").exists()
    done = run_cli("convert", "imagefolder", tmp_path / "train", tmp_path / "s.beton", "--on-error", "skip",
               "--report", tmp_path / "report.json", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"skipped {len(reasons)} of {len(reasons) + 6} sources (6 written)")
    assert "samples/s" in done.stdout
    assert "classes of 'label': 0=cat, 1=dog" in done.stdout
    for name in reasons:
        assert f"{name}: " in done.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["num_samples"] == 6 and len(report["skipped"]) == len(reasons) and report["seconds"] > 0


def test_file_names_cannot_drive_the_terminal(tmp_path):
    root = tmp_path / "train" / "c\x1b[31mlass"
    root.mkdir(parents=True)
    (root / "a.jpg").write_bytes(jpeg(1))
    (root / "\x1b]0;title\x07.jpg").write_bytes(b"junk")
    done = run_cli("convert", "imagefolder", tmp_path / "train", tmp_path / "t.beton", "--on-error", "skip",
               "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "c\\x1b[31mlass" in done.stdout and "\\x1b]0;title\\x07.jpg" in done.stdout


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    root = tmp_path / "train" / "cat"
    root.mkdir(parents=True)
    (root / "a.jpg").write_bytes(jpeg(1))
    (root / "b.jpg").write_bytes(jpeg(2))
    folder = ImageFolder(tmp_path / "train")
    (root / "b.jpg").unlink()  # gone between listing and reading
    with pytest.raises(OSError, match="no longer exists"):
        folder[1]
    if os.geteuid() != 0:  # root reads any file, whatever its mode
        (root / "c.jpg").write_bytes(jpeg(3))
        os.chmod(root / "c.jpg", 0)
        report = beton.convert.imagefolder(tmp_path / "train", tmp_path / "r.beton", on_error="skip",
                                           num_workers=0, progress=False)
        assert [item.reason for item in report.skipped] == ["OSError: cannot be read: Permission denied"]


def test_empty_class_folders_fail_or_stay_as_labels(tmp_path):
    root = tmp_path / "train"
    for name in ("ant", "bee", "cat"):
        (root / name).mkdir(parents=True)
    (root / "ant" / "a.jpg").write_bytes(jpeg(1))
    (root / "cat" / "c.jpg").write_bytes(jpeg(3))
    (root / "bee" / "readme.txt").write_text("no images here")
    with pytest.raises(ConversionError, match="class folders without image files: 'bee'"):
        beton.convert.imagefolder(root, tmp_path / "e.beton", num_workers=0, progress=False)
    with pytest.warns(beton.convert.ConversionWarning, match="kept as labels without samples: 'bee'"):
        report = beton.convert.imagefolder(root, tmp_path / "e.beton", on_error="skip", num_workers=0,
                                           progress=False)
    assert report.metadata["classes"]["label"] == ["ant", "bee", "cat"]
    with beton.Reader(tmp_path / "e.beton") as reader:
        assert [reader[i][1] for i in range(len(reader))] == [0, 2]  # cat keeps label 2, as in a full split
    done = run_cli("convert", "imagefolder", root, tmp_path / "cli.beton", "--on-error", "skip", "--no-progress")
    assert done.returncode == 0 and "note: class folders without image files" in done.stdout
    assert "Warning" not in done.stderr


def test_a_class_whose_every_file_is_skipped_is_noted(tmp_path):
    root = tmp_path / "train"
    (root / "ant").mkdir(parents=True)
    (root / "bee").mkdir()
    (root / "ant" / "a.jpg").write_bytes(jpeg(1))
    (root / "bee" / "b.jpg").write_bytes(b"broken")
    report = beton.convert.imagefolder(root, tmp_path / "n.beton", on_error="skip", num_workers=0, progress=False)
    assert "classes whose every file was skipped, now labels without samples: 'bee'" in report.notes


def test_every_file_skipped_is_an_error_and_the_target_is_kept(tmp_path):
    (tmp_path / "train" / "cat").mkdir(parents=True)
    (tmp_path / "train" / "cat" / "a.jpg").write_bytes(b"nothing")
    (tmp_path / "x.beton").write_bytes(b"an older file")
    with pytest.raises(ConversionError, match=r"every source was skipped .* the first: .*cat/a.jpg: field 'image'"):
        beton.convert.imagefolder(tmp_path / "train", tmp_path / "x.beton", on_error="skip", num_workers=2,
                                  progress=False)
    assert (tmp_path / "x.beton").read_bytes() == b"an older file"


def test_keep_alpha_and_keep_depth_store_exact_pixels(tmp_path):
    root = tmp_path / "train" / "only"
    root.mkdir(parents=True)
    (root / "a.png").write_bytes(encoded(rgba(1), "PNG"))
    (root / "b.png").write_bytes(png16(2))
    (root / "c.jpg").write_bytes(jpeg(3))
    report = beton.convert.imagefolder(tmp_path / "train", tmp_path / "k.beton", keep_alpha=True, keep_depth=True,
                                       num_workers=0, progress=False)
    assert not report.notes
    with beton.Reader(tmp_path / "k.beton") as reader:
        field = reader.fields["image"]
        assert (field.write_mode, field.channels, field.dtype) == ("lossless", 4, "uint16")
        a, b, c = (reader[i][0] for i in range(3))
    np.testing.assert_array_equal(a, rgba(1).astype(np.uint16) * 257)
    np.testing.assert_array_equal(b[:, :, :3], photo(2).astype(np.uint16) * 257 + 2)
    assert (b[:, :, 3] == 65535).all() and (c[:, :, 3] == 65535).all()
    np.testing.assert_array_equal(c[:, :, :3], simplejpeg.decode_jpeg(jpeg(3)).astype(np.uint16) * 257)


def test_grey_channels_and_max_resolution(tmp_path):
    root = tmp_path / "train" / "only"
    root.mkdir(parents=True)
    big, small = jpeg(1, height=120, width=90), jpeg(2, height=40, width=30)
    (root / "big.jpg").write_bytes(big)
    (root / "small.jpg").write_bytes(small)
    (root / "colour.png").write_bytes(encoded(photo(3), "PNG"))
    beton.convert.imagefolder(tmp_path / "train", tmp_path / "g.beton", channels=1, max_resolution=60,
                              num_workers=0, progress=False)
    with beton.Reader(tmp_path / "g.beton") as reader:
        images = [reader[i][0] for i in range(3)]
        assert bytes(reader.payload(2, "image")) == with_restart_markers(small)  # within the bound: not re-encoded
    assert images[0].shape == (60, 45, 1) and images[2].shape == (40, 30, 1) and images[1].shape == (36, 44, 1)
    expected = cv2.cvtColor(photo(3), cv2.COLOR_RGB2GRAY)
    assert np.abs(images[1][:, :, 0].astype(int) - expected.astype(int)).mean() < 3


def test_options_reach_the_stored_field_and_the_file_does_not_depend_on_workers(tmp_path):
    root = tmp_path / "train" / "only"
    root.mkdir(parents=True)
    for k in range(12):
        (root / f"{k:02d}.png").write_bytes(encoded(photo(k, height=20 + k, width=30), "PNG"))
    options = dict(write_mode="proportion", compress_probability=0.25, jpeg_quality=70, page_size=4096,
                   progress=False)
    beton.convert.imagefolder(tmp_path / "train", tmp_path / "0.beton", num_workers=0, **options)
    beton.convert.imagefolder(tmp_path / "train", tmp_path / "2.beton", num_workers=2, **options)
    assert (tmp_path / "0.beton").read_bytes() == (tmp_path / "2.beton").read_bytes()
    with beton.Reader(tmp_path / "0.beton") as reader:
        field = reader.fields["image"]
        assert (field.write_mode, field.compress_probability, field.jpeg_quality) == ("proportion", 0.25, 70)
        assert reader.page_size == 4096 and 0 < np.mean(reader.data_table["image"]["mode"] == 1) < 1
    smart = run_cli("convert", "imagefolder", tmp_path / "train", tmp_path / "s.beton", "--write-mode", "smart",
                "--smart-threshold", "2000", "--page-size", "64KiB", "--no-progress")
    assert smart.returncode == 0, smart.stderr
    with beton.Reader(tmp_path / "s.beton") as reader:
        assert reader.fields["image"].smart_threshold == 2000 and reader.page_size == 65536
        raw_sizes = reader.data_table["image"]["height"].astype(int) * reader.data_table["image"]["width"] * 3
        np.testing.assert_array_equal(reader.data_table["image"]["mode"], (raw_sizes > 2000).astype(np.uint8))


@pytest.mark.parametrize("arguments, message", [
    (["--keep-alpha", "--write-mode", "jpg"], "keep_alpha and keep_depth store images exactly"),
    (["--keep-alpha", "--channels", "1"], "keep_alpha stores RGBA images"),
    (["--write-mode", "smart"], "give smart_threshold"),
])
def test_options_that_do_not_go_together_are_refused(tmp_path, arguments, message):
    (tmp_path / "train" / "a").mkdir(parents=True)
    (tmp_path / "train" / "a" / "x.jpg").write_bytes(jpeg(1))
    result = run_cli("convert", "imagefolder", tmp_path / "train", tmp_path / "o.beton", *arguments)
    assert result.returncode == 1 and message in result.stderr


def test_every_flag_has_help_text():
    import argparse

    from beton.tools.cli import build_parser

    def walk(parser, trail):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, trail + [name])
            elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                yield " ".join(trail), action

    found = list(walk(build_parser(), ["beton"]))
    assert len({command for command, _ in found}) >= 10  # every command and converter was walked
    assert not [f"{command}: {action.dest}" for command, action in found if not action.help]
