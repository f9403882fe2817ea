"""Reading .beton files from URLs (``https://``, ``s3://``, anything fsspec resolves), page by page.

Nothing here knows the file format beyond "a heap of fixed-size pages, each with a CRC32": the Reader
(:mod:`beton.storage.reader`) validates the header and tables it fetches through :class:`RemoteBytes` exactly as it
validates a local file, then hands the page geometry and checksums to :class:`RemotePages`.

Modules, lowest first: ``options`` (what a user sets, URL detection), ``answers`` (an answer held to the size asked
for), ``http`` (HTTP(S) sizes and ranges by beton's own streamed requests, redirects by policy), ``fetch`` (byte
ranges and sizes of every store, with timeouts and retries), ``cache`` (the on-disk page cache shared by the
processes of a node), ``pages`` (checked pages, several requests in flight, read ahead in the epoch's order),
``file`` (one opened remote file: identity, the structure bytes, the pages), ``source`` (the
:class:`~beton.storage.page_source.PageSource` the process cache reads through). See docs/remote.md.
"""

from beton.storage.remote.file import RemoteBytes, RemoteFile
from beton.storage.remote.options import RemoteOptions, is_http, is_url, remote_or_default
from beton.storage.remote.pages import RemotePages
from beton.storage.remote.source import RemotePageSource

__all__ = ["RemoteOptions", "is_http", "is_url", "remote_or_default", "RemoteFile", "RemoteBytes", "RemotePages",
           "RemotePageSource"]
