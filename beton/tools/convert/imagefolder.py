"""Image folders, torchvision's layout: ``root/<class>/**/<image>``, labels from the sorted class folder names.

Which files count, as torchvision counts them: files whose name ends with an image extension
(:data:`~beton.tools.convert.images.IMAGE_EXTENSIONS`, any case), in class folders and their subfolders, in the
order torchvision lists them (subfolders sorted by path, files by name). Unlike torchvision, names starting with
a dot are left out (``.ipynb_checkpoints``, macOS's ``._photo.jpg``), and a symbolic link back to a folder
already listed is not followed again (torchvision would loop forever); both are counted in the report's notes,
as are files without an image extension.

The folder is untrusted input, and only its regular files are read:

* **Symbolic links** within the folder are followed, to files and folders alike. A link out of it is a bad
  source unless ``follow_links=True`` (``--follow-links``); a folder link to the image folder itself or above it
  is never followed (its classes would be labelled as the class holding the link).
* **Not regular files** (FIFOs, devices, sockets), by the status of what a name leads to, are bad sources and
  are never opened; a file is opened without blocking and checked again on its descriptor, so one swapped in
  after listing cannot hang the conversion either.
* **Sizes are checked before reading**: a file larger than ``max_file_bytes`` (default 256 MiB) is a bad source.

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
import stat
import warnings
from typing import Any

from beton.fields import IntField
from beton.storage import format as fmt
from beton.storage.remote.options import RemoteOptions
from beton.tools.convert.images import IMAGE_EXTENSIONS, ImageOptions
from beton.tools.convert.report import (DEFAULT_MAX_FILE_BYTES, ConversionError, ConversionReport, ConversionWarning,
                                       SkippedSource, base_metadata, check_max_file_bytes, write)

__all__ = ["ImageFolder", "imagefolder"]


class ImageFolder:
    """The files of an image folder (see the module docstring); ``dataset[i]`` is ``(file bytes, label)``.

    Attributes:
        root: the folder, as given.
        classes: class names, sorted; label i is ``classes[i]``.
        samples: ``(path, label)`` of every image file, in order.
        empty_classes: classes whose folder holds no image file.
        unreadable: ``(path, reason)`` of folders that could not be listed and of entries refused while listing
            (not regular files, symbolic links out of the folder, files larger than ``max_file_bytes``).
        ignored: what was left out while listing and how many (``{"files without an image extension": 3}``).
        follow_links, max_file_bytes: as given.
    """

    def __init__(self, root: str | os.PathLike[str], *, follow_links: bool = False,
                 max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES) -> None:
        self.root = os.fspath(root)
        self.follow_links = follow_links
        self.max_file_bytes = check_max_file_bytes(max_file_bytes)
        if not os.path.isdir(self.root):
            raise ConversionError(f"image folder {self.root!r} does not exist or is not a folder")
        self._real_root = os.path.realpath(self.root)
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
            elif _is_folder(entry):
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
        if not self.samples and not self.unreadable:
            raise ConversionError(f"{self.root!r} has class folders but no image files "
                                  f"({', '.join(IMAGE_EXTENSIONS)})")

    def _ignore(self, what: str) -> None:
        self.ignored[what] = self.ignored.get(what, 0) + 1

    def _link_problem(self, path: str, folder: bool) -> str | None:
        """Why the symbolic link ``path`` is not followed, or None: a link out of the image folder (unless
        ``follow_links``), or a folder link to the image folder itself or above it (its classes would be listed
        again under this one's label)."""
        real = os.path.realpath(path)
        target = os.readlink(path)
        if folder and _inside(self._real_root, real):
            return (f"symbolic link to the image folder or above it (to {target!r}): its classes would be labelled "
                    "as this one; it is not followed")
        if not self.follow_links and not _inside(real, self._real_root):
            return (f"symbolic link out of the image folder (to {target!r}); follow_links=True (--follow-links) "
                    "follows it")
        return None

    def _image_files(self, class_folder: str) -> list[str]:
        """The image files under one class folder, in torchvision's order (folders by path, files by name)."""
        listed: list[tuple[str, list[str]]] = []
        seen: set[str] = set()
        pending = [class_folder]
        while pending:
            directory = pending.pop()
            if os.path.islink(directory):
                problem = self._link_problem(directory, folder=True)
                if problem is not None:
                    self.unreadable.append((directory, problem))
                    continue
            real = os.path.realpath(directory)
            if real in seen:  # a link back to a folder already listed: do not walk it forever
                self._ignore("symbolic links to a folder already listed")
                continue
            seen.add(real)
            try:
                entries = list(os.scandir(directory))
            except OSError as error:
                self.unreadable.append((directory, f"folder cannot be listed: {error.strerror or error}"))
                continue
            chosen, subfolders = [], []
            for entry in entries:
                if entry.name.startswith("."):
                    self._ignore("hidden entries (names starting with a dot)")
                elif _is_folder(entry):
                    subfolders.append(entry.path)
                elif not entry.name.lower().endswith(IMAGE_EXTENSIONS):
                    self._ignore("files without an image extension")  # never opened, whatever it is
                else:
                    problem = self._file_problem(entry)
                    if problem is None:
                        chosen.append(entry.name)
                    else:
                        self.unreadable.append((entry.path, problem))
            listed.append((directory, sorted(chosen)))
            pending += sorted(subfolders, reverse=True)  # walked in order, so which of two links wins is fixed
        return [os.path.join(directory, file) for directory, files in sorted(listed) for file in files]

    def _file_problem(self, entry: os.DirEntry) -> str | None:
        """Why an image file is refused while listing, or None (a broken link is left to the read, which names
        it)."""
        if entry.is_symlink():
            problem = self._link_problem(entry.path, folder=False)
            if problem is not None:
                return problem
        try:
            info = entry.stat()  # follows a link
        except OSError:
            return None
        return _stat_problem(info, self.max_file_bytes)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        path, label = self.samples[index]
        if os.path.islink(path):  # checked again: the link may have changed since it was listed
            problem = self._link_problem(path, folder=False)
            if problem is not None:
                raise OSError(problem)
        return _read_regular_file(path, self.max_file_bytes), label


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows a link; whether to walk it is decided by _link_problem
    except OSError:
        return False


def _inside(path: str, folder: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


_FILE_KINDS = ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "named pipe (FIFO)"), (stat.S_ISCHR, "character device"),
               (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def _stat_problem(info: os.stat_result, max_file_bytes: int | None) -> str | None:
    """Why a file whose status is ``info`` is not read: not a regular file, or larger than the cap."""
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), "special file")
        return f"is a {kind}, not a regular file; it is not read"
    if max_file_bytes is not None and info.st_size > max_file_bytes:
        return (f"is {info.st_size} bytes, more than max_file_bytes={max_file_bytes} (--max-file-bytes); "
                "it is not read")
    return None


def _read_regular_file(path: str, max_file_bytes: int | None) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_file_bytes`` of them. Its type is checked before it
    is opened, and again on the open descriptor (opened without blocking, so a FIFO put there meanwhile cannot
    hang the read); a file that grew past the cap since is refused."""
    try:
        problem = _stat_problem(os.stat(path), max_file_bytes)
        if problem is not None:
            raise OSError(problem)
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if os.path.islink(path):
            raise OSError(f"broken symbolic link (to {os.readlink(path)!r})") from None
        raise OSError("no longer exists") from None
    except OSError as error:
        raise OSError(error.strerror and f"cannot be read: {error.strerror}" or str(error)) from None
    with os.fdopen(descriptor, "rb") as file:
        problem = _stat_problem(os.fstat(descriptor), max_file_bytes)
        if problem is not None:
            raise OSError(problem)
        try:
            data = file.read() if max_file_bytes is None else file.read(max_file_bytes + 1)
        except OSError as error:
            raise OSError(f"cannot be read: {error.strerror or error}") from None
    if max_file_bytes is not None and len(data) > max_file_bytes:
        raise OSError(f"grew past max_file_bytes={max_file_bytes} (--max-file-bytes) while read; it is refused")
    return data


def imagefolder(source: str | os.PathLike[str], output: str | os.PathLike[str], *, on_error: str = "fail",
                metadata: dict[str, Any] | None = None, num_workers: int = -1,
                page_size: int = fmt.DEFAULT_PAGE_SIZE, progress: bool = True, follow_links: bool = False,
                remote: RemoteOptions | None = None,
                max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES, **image_options: Any) -> ConversionReport:
    """Write an image folder (see the module docstring) as fields ``image`` and ``label``.

    Args:
        source: the folder holding one folder per class.
        output: the .beton file to write (replaced only when writing succeeds).
        on_error: "fail" (default): the first file that cannot be read or stored raises ConversionError naming
            it; "skip": such files are left out and listed in the report.
        metadata: extra file-level metadata; the class names (``metadata["classes"]["label"]``), the source root
            and the beton version are stored anyway.
        num_workers, page_size, progress, remote: as for :class:`~beton.DatasetWriter` (``output`` may be a URL).
        follow_links: follow symbolic links that lead out of the folder (by default such a link is a bad
            source, as are links to the folder itself or above it, which are never followed).
        max_file_bytes: the largest file read (checked before reading; None: no cap). A larger file, or one
            that is not a regular file (a FIFO, a device, a socket), is a bad source and is not opened.
        image_options: :class:`~beton.tools.convert.images.ImageOptions` (write_mode, max_resolution,
            jpeg_quality, smart_threshold, compress_probability, channels, keep_alpha, keep_depth).

    Returns the :class:`~beton.tools.convert.report.ConversionReport`.
    """
    field = ImageOptions(**image_options).field()
    folder = ImageFolder(source, follow_links=follow_links, max_file_bytes=max_file_bytes)
    notes = [f"{count} {what} left out" for what, count in folder.ignored.items()]
    skipped_before = [SkippedSource(path, reason) for path, reason in folder.unreadable]
    if skipped_before and (on_error == "fail" or not folder.samples):
        first = skipped_before[0]
        if on_error == "fail":
            raise ConversionError(f"{first.source}: {first.reason} (on_error='skip', --on-error skip, leaves it out)")
        raise ConversionError(f"every image file was refused; the first: {first.source}: {first.reason}")
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
                   progress=progress, remote=remote)
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
