"""Locations of tables, checkpoints and alias pointers: URIs, never pathlib.

A location is either a URI (`s3://bucket/wh`, `gs://…`, `abfss://…`, `hdfs://…`, `file:///tmp/wh`),
kept as given, or a local path, normalised to a plain absolute path string (`/tmp/wh`). Both are
what Spark (`checkpointLocation`, `--output`) and delta-rs accept, so a warehouse on shared
storage works on a cluster the same way as a local one. Segments are joined as strings (`join`)
and files are reached through pyarrow's filesystems (`filesystem`), so nothing here turns a URI
into a `pathlib.Path` (which would collapse `s3://b/x` into `s3:/b/x`).

The driver's own files (status.json, job.log, launch.json under the state dir) stay local Paths;
this module is for what a cluster's executors, the jobs and the readers share.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from orchestrator.core.exceptions import ConfigError

__all__ = ["OBJECT_STORES", "delete_tree", "exists", "filesystem", "is_local", "join", "local_path", "normalize",
           "read_bytes", "read_text", "scheme", "size", "write_atomic"]

#: Schemes whose single put is atomic (the object appears whole on close, or not at all).
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "wasb", "wasbs", "adl", "oss"})

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: `file:/x` (Hadoop's way of printing a local URI) and `s3:/b/x` (a URI that went through pathlib).
_ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")


def scheme(location: str | os.PathLike) -> str | None:
    """The lower-case scheme of a URI (`s3`, `file`…); None for a plain path."""
    m = _SCHEME.match(str(location)) if isinstance(location, str) else None
    return m.group(1).lower() if m else None


def normalize(location: str | os.PathLike) -> str:
    """The location as kappa stores and passes it: a URI as given (a trailing `/` dropped), a local path
    (a Path or a str without scheme) absolute, `~` expanded. `file:/x` becomes `file:///x`; `s3:/b/x`,
    a URI whose `//` a `pathlib.Path` swallowed, is refused (ConfigError) rather than guessed at."""
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str) or not location.strip():
        raise ConfigError(f"a location must be a non-empty path or URI, not {location!r}")
    location = location.strip()
    m = _SCHEME.match(location)
    if m:
        rest = location[m.end():]
        if not rest.strip("/"):
            if m.group(1).lower() == "file":
                return "file:///"
            raise ConfigError(f"the URI {location!r} names no bucket or host; give e.g. s3://bucket/warehouse")
        return m.group(1) + "://" + (rest.rstrip("/") or "/")
    one = _ONE_SLASH.match(location)
    if one:
        if one.group(1).lower() == "file":
            rest = location[one.end():].rstrip("/")
            return f"file:///{rest}"
        raise ConfigError(f"the location {location!r} looks like a URI that lost its '//' (was it passed through "
                          f"pathlib.Path?); give it as {one.group(1)}://{location[one.end():]}")
    return os.path.abspath(os.path.expanduser(location))


def is_local(location: str | os.PathLike) -> bool:
    """Whether the location is on this host's filesystem (a plain path or `file://`)."""
    return scheme(normalize(location)) in (None, "file")


def local_path(location: str | os.PathLike) -> Path | None:
    """The local Path of a plain path or `file://` URI; None for any other scheme."""
    loc = normalize(location)
    s = scheme(loc)
    if s is None:
        return Path(loc)
    if s == "file":
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(loc)
        if parts.netloc not in ("", "localhost"):
            return None
        return Path(unquote(parts.path) or "/")
    return None


def join(base: str | os.PathLike, *segments: str) -> str:
    """`base` with `segments` appended, separated by `/`: `join("s3://b/wh", "pipe", "v1") == "s3://b/wh/pipe/v1"`.

    A segment may hold `/` (`"offsets/3"`) but no empty, `.` or `..` part and must not be absolute.
    """
    out = normalize(base)
    for seg in segments:
        seg = str(seg)
        parts = seg.split("/")
        if not seg or seg.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ConfigError(f"cannot join {seg!r} to the location {out}: a segment is a relative name without "
                              f"empty, '.' or '..' parts")
        out = out + seg if out.endswith("/") else f"{out}/{seg}"
    return out


def filesystem(location: str | os.PathLike) -> tuple[Any, str]:
    """(pyarrow FileSystem, path inside it) for a location: LocalFileSystem for a plain path, else
    `pyarrow.fs.FileSystem.from_uri` (file://, s3://, gs://, abfss://, hdfs://…)."""
    from pyarrow import fs as pafs

    loc = normalize(location)
    if scheme(loc) is None:
        return pafs.LocalFileSystem(), loc
    return pafs.FileSystem.from_uri(loc)


def _info(location: str | os.PathLike):
    fs, path = filesystem(location)
    return fs, path, fs.get_file_info(path)


def exists(location: str | os.PathLike) -> bool:
    """Whether a file or directory is at the location (on an object store: an object or a prefix)."""
    from pyarrow import fs as pafs

    return _info(location)[2].type != pafs.FileType.NotFound


def size(location: str | os.PathLike) -> int:
    """Bytes of the file, or of every file under the directory, at the location; 0 if there is none
    (files that vanish while it counts, as under a concurrent delete, count nothing)."""
    from pyarrow import fs as pafs

    try:
        fs, path, info = _info(location)
        if info.type == pafs.FileType.File:
            return int(info.size or 0)
        if info.type != pafs.FileType.Directory:
            return 0
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError:
        return 0
    return sum(int(i.size or 0) for i in infos if i.type == pafs.FileType.File)


def delete_tree(location: str | os.PathLike) -> bool:
    """Delete the directory (with everything under it) or the file at the location; whether something
    was there. Idempotent: a missing location, or one deleted meanwhile by another process, is fine;
    OSError when something is still there afterwards."""
    from pyarrow import fs as pafs

    fs, path, info = _info(location)
    if info.type == pafs.FileType.NotFound:
        return False
    for attempt in range(3):  # a concurrent deleter makes a walk fail half-way: walk what is left again
        try:
            if info.type == pafs.FileType.Directory:
                fs.delete_dir(path)
            else:
                fs.delete_file(path)
        except OSError:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                break
            if attempt == 2:
                raise
        else:
            break
    return True


def write_atomic(location: str | os.PathLike, data: bytes | str, *, mode: int = 0o644) -> None:
    """Replace the small file at the location so that a reader sees the old content or the new, never a part.

    Local: `orchestrator.core.files.write_atomic` (temporary file, fsync, rename, `mode`). An object store:
    one put, atomic by itself. Any other filesystem (HDFS): a temporary file moved over the target.
    """
    raw = data.encode() if isinstance(data, str) else data
    local = local_path(location)
    if local is not None:
        from orchestrator.core.files import write_atomic as write_local

        write_local(local, raw, mode=mode)
        return
    fs, path = filesystem(location)
    parent = path.rsplit("/", 1)[0]
    if scheme(normalize(location)) in OBJECT_STORES:
        with fs.open_output_stream(path) as f:
            f.write(raw)
        return
    import secrets

    fs.create_dir(parent, recursive=True)
    name = path.rsplit("/", 1)[-1]
    tmp = f"{parent}/.{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(raw)
    try:
        fs.move(tmp, path)
    except BaseException:
        try:
            fs.delete_file(tmp)
        except OSError:
            pass
        raise


def read_bytes(location: str | os.PathLike) -> bytes | None:
    """The content of the small file at the location; None when there is no such file."""
    local = local_path(location)
    try:
        if local is not None:
            return local.read_bytes()
        fs, path = filesystem(location)
        with fs.open_input_stream(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def read_text(location: str | os.PathLike, errors: str = "strict") -> str | None:
    """`read_bytes` decoded as UTF-8; None when there is no such file."""
    raw = read_bytes(location)
    return None if raw is None else raw.decode("utf-8", errors)
