"""Image folders, torchvision's layout: ``root/<class>/**/<image>``, labels from the sorted class folder names.

Which files count, as torchvision counts them: files (symbolic links followed) whose name ends with an image
extension (:data:`~beton.tools.convert.images.IMAGE_EXTENSIONS`, any case), in class folders and their
subfolders, in the order torchvision lists them (subfolders sorted by path, files by name). Unlike torchvision,
names starting with a dot are left out (``.ipynb_checkpoints``, macOS's ``._photo.jpg``), and a symbolic link
back to a folder already listed is not followed again (torchvision would loop forever); both are counted in the
report's notes, as are files without an image extension.

What a file holds is decided by its content (:mod:`beton.tools.convert.images`), in the writer's workers. A file
that cannot be read (a broken symbolic link, no permission) or decoded (truncated, corrupt, not an image)
fails the conversion naming it, or with ``on_error="skip"`` is left out and listed in the report.

A class folder without images is an error, as in torchvision; with ``on_error="skip"`` it stays in the class
list (so labels keep following the folder names, and agree with another split of the same dataset) with a
warning and a note.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import warnings
from typing import Any

from beton.fields import IntField
from beton.storage import format as fmt
from beton.tools.convert.images import IMAGE_EXTENSIONS, ImageOptions
from beton.tools.convert.report import (ConversionError, ConversionReport, ConversionWarning, SkippedSource,
                                       base_metadata, write)

__all__ = ["ImageFolder", "imagefolder"]


class ImageFolder:
    """The files of an image folder (see the module docstring); ``dataset[i]`` is ``(file bytes, label)``.

    Attributes:
        root: the folder, as given.
        classes: class names, sorted; label i is ``classes[i]``.
        samples: ``(path, label)`` of every image file, in order.
        empty_classes: classes whose folder holds no image file.
        unreadable: ``(folder, reason)`` of folders that could not be listed.
        ignored: what was left out while listing and how many (``{"files without an image extension": 3}``).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise ConversionError(f"image folder {self.root!r} does not exist or is not a folder")
        self.ignored: dict[str, int] = {}
        self.unreadable: list[tuple[str, str]] = []
        try:
            entries = sorted(os.scandir(self.root), key=lambda entry: entry.name)
        except OSError as error:
            raise ConversionError(f"image folder {self.root!r} cannot be listed: {error.strerror or error}") from None
        self.classes = []
        for entry in entries:
            if entry.name.startswith("."):
                self._ignore("hidden entries (names starting with a dot)")
            elif entry.is_dir():
                self.classes.append(entry.name)
        if not self.classes:
            raise ConversionError(f"{self.root!r} has no class folders (expected {self.root}/<class>/<image files>)")
        self.samples: list[tuple[str, int]] = []
        self.empty_classes: list[str] = []
        for label, name in enumerate(self.classes):
            files = self._image_files(os.path.join(self.root, name))
            if not files:
                self.empty_classes.append(name)
            self.samples += [(path, label) for path in files]
        if not self.samples:
            raise ConversionError(f"{self.root!r} has class folders but no image files "
                                  f"({', '.join(IMAGE_EXTENSIONS)})")

    def _ignore(self, what: str) -> None:
        self.ignored[what] = self.ignored.get(what, 0) + 1

    def _image_files(self, folder: str) -> list[str]:
        listed, seen = [], set()
        for directory, subfolders, files in os.walk(folder, followlinks=True,
                                                    onerror=lambda error: self.unreadable.append(
                                                        (error.filename, error.strerror or str(error)))):
            real = os.path.realpath(directory)
            if real in seen:  # a link back to a folder already listed: do not walk it forever
                subfolders[:] = []
                self._ignore("symbolic links to a folder already listed")
                continue
            seen.add(real)
            for hidden in [name for name in subfolders if name.startswith(".")]:
                subfolders.remove(hidden)
                self._ignore("hidden entries (names starting with a dot)")
            chosen = []
            for file in files:
                if file.startswith("."):
                    self._ignore("hidden entries (names starting with a dot)")
                elif file.lower().endswith(IMAGE_EXTENSIONS):
                    chosen.append(file)
                else:
                    self._ignore("files without an image extension")
            listed.append((directory, sorted(chosen)))
        return [os.path.join(directory, file) for directory, files in sorted(listed) for file in files]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        path, label = self.samples[index]
        try:
            with open(path, "rb") as file:
                return file.read(), label
        except FileNotFoundError:
            if os.path.islink(path):
                raise OSError(f"broken symbolic link (to {os.readlink(path)!r})") from None
            raise OSError("no longer exists") from None
        except OSError as error:
            raise OSError(f"cannot be read: {error.strerror or error}") from None


def imagefolder(source: str | os.PathLike[str], output: str | os.PathLike[str], *, on_error: str = "fail",
                metadata: dict[str, Any] | None = None, num_workers: int = -1,
                page_size: int = fmt.DEFAULT_PAGE_SIZE, progress: bool = True,
                **image_options: Any) -> ConversionReport:
    """Write an image folder (see the module docstring) as fields ``image`` and ``label``.

    Args:
        source: the folder holding one folder per class.
        output: the .beton file to write (replaced only when writing succeeds).
        on_error: "fail" (default): the first file that cannot be read or stored raises ConversionError naming
            it; "skip": such files are left out and listed in the report.
        metadata: extra file-level metadata; the class names (``metadata["classes"]["label"]``), the source root
            and the beton version are stored anyway.
        num_workers, page_size, progress: as for :class:`~beton.DatasetWriter`.
        image_options: :class:`~beton.tools.convert.images.ImageOptions` (write_mode, max_resolution,
            jpeg_quality, smart_threshold, compress_probability, channels, keep_alpha, keep_depth).

    Returns the :class:`~beton.tools.convert.report.ConversionReport`.
    """
    field = ImageOptions(**image_options).field()
    folder = ImageFolder(source)
    notes = [f"{count} {what} left out" for what, count in folder.ignored.items()]
    skipped_before = [SkippedSource(path, f"folder cannot be listed: {reason}") for path, reason in folder.unreadable]
    if skipped_before and on_error == "fail":
        first = skipped_before[0]
        raise ConversionError(f"{first.source}: {first.reason} (on_error='skip', --on-error skip, leaves it out)")
    if folder.empty_classes:
        listed = ", ".join(repr(name) for name in folder.empty_classes)
        if on_error == "fail":
            raise ConversionError(f"class folders without image files: {listed} (torchvision refuses them too); "
                                  "remove them, or pass on_error='skip' (--on-error skip) to keep them as labels "
                                  "without samples")
        message = f"class folders without image files, kept as labels without samples: {listed}"
        warnings.warn(message, ConversionWarning, stacklevel=2)
        notes.append(message)
    stored = base_metadata("imagefolder", {"root": os.path.abspath(folder.root)}, {"label": folder.classes}, metadata)
    report = write(output, {"image": field, "label": IntField()}, folder, indexed=True,
                   source_name=lambda index: folder.samples[index][0], metadata=stored, on_error=on_error,
                   skipped_before=skipped_before, notes=notes, num_workers=num_workers, page_size=page_size,
                   progress=progress)
    return _with_emptied_classes(report, folder)


def _with_emptied_classes(report: ConversionReport, folder: ImageFolder) -> ConversionReport:
    """The report, noting classes whose every file was skipped (their labels have no samples now)."""
    labels = dict(folder.samples)
    left = collections.Counter(label for _, label in folder.samples)
    left.subtract(labels[item.source] for item in report.skipped if item.source in labels)
    emptied = [folder.classes[label] for label, count in sorted(left.items())
               if count == 0 and folder.classes[label] not in folder.empty_classes]
    if not emptied:
        return report
    note = f"classes whose every file was skipped, now labels without samples: {', '.join(map(repr, emptied))}"
    return dataclasses.replace(report, notes=(*report.notes, note))
