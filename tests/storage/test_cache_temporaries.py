"""The disk page cache removes the temporaries a crashed process leaves (``.partial-*`` pages, ``.usage-*``,
``.version-*``) and counts those still being written against its limit."""

from __future__ import annotations

import os
import time

from beton.storage.remote.cache import STALE_TEMPORARY_SECONDS, DiskPageCache

PAGE = 1000


def plant(directory: str, name: str, size: int, age_seconds: float) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as file:
        file.write(bytes(size))
    then = time.time() - age_seconds
    os.utime(path, (then, then))
    return path


def entries(directory: str) -> set[str]:
    return set(os.listdir(directory))


def test_opening_removes_a_crashed_writers_temporaries_and_keeps_live_ones(tmp_path):
    cache = DiskPageCache(tmp_path, None, "url", ("file",))
    assert cache.stale_temporaries_removed == 0
    cache.put(0, bytes(PAGE))
    old = STALE_TEMPORARY_SECONDS + 60
    plant(cache.directory, ".partial-00000000000000aa", PAGE, old)  # killed between writing and renaming
    plant(cache.directory, ".partial-00000000000000bb", PAGE, 1)  # another process writing now
    plant(cache.root, ".usage-00000000000000cc", 3, 1)  # killed while writing usage (under the lock)
    plant(cache.root, ".version-00000000000000ee", 32, 1)  # killed while recording the URL's version (likewise)
    outside = plant(str(tmp_path), "outside", 5, 0)
    os.symlink(outside, os.path.join(cache.root, ".usage-00000000000000dd"))
    again = DiskPageCache(tmp_path, None, "url", ("file",))
    assert again.stale_temporaries_removed == 4
    assert entries(cache.directory) == {"0", ".partial-00000000000000bb"}
    assert not {".usage-00000000000000cc", ".usage-00000000000000dd", ".version-00000000000000ee"} & entries(cache.root)
    assert os.path.getsize(outside) == 5  # a link is removed, never followed
    assert again.get(0, PAGE) == bytes(PAGE)


def test_eviction_removes_stale_temporaries_everywhere_and_counts_live_ones(tmp_path):
    limit = 4 * PAGE
    other = DiskPageCache(tmp_path, limit, "other url", ("other file",))
    other.put(0, bytes(PAGE))
    stale = plant(other.directory, ".partial-00000000000000aa", 50 * PAGE, STALE_TEMPORARY_SECONDS + 60)
    writing = plant(other.directory, ".partial-00000000000000bb", PAGE, 1)
    cache = DiskPageCache(tmp_path, limit, "url", ("file",))  # opening sweeps its own directory only
    assert os.path.exists(stale)
    for page in range(4):  # the fourth page does not fit beside three, the other file's page and the live temporary
        cache.put(page, bytes([page]) * PAGE)
        time.sleep(0.01)  # distinct modification times: least recently used first
    assert not os.path.exists(stale) and os.path.exists(writing)
    pages = [name for name in entries(cache.directory) if not name.startswith(".")]
    held = (len(pages) + len(entries(other.directory) - {".partial-00000000000000bb"})) * PAGE
    assert held + PAGE <= limit  # the live temporary counted
    assert cache.get(3, PAGE) == bytes([3]) * PAGE
