"""Reading a query's offsets back from its Spark checkpoint; runs anywhere, no Spark needed.

``<checkpoint>/offsets/<batch_id>`` holds the end offsets Spark planned and logged for a batch
before running it, ``<checkpoint>/commits/<batch_id>`` marks it processed: together they are the
truth about what a query has processed (the orchestrator's lag and the job runtime read them).
"""

from __future__ import annotations

import json
import os

from jobs.lib.source.offsets import map_to_offsets, merge_offsets, offsets_to_map
from orchestrator.core import uris
from orchestrator.core.exceptions import SourceError

__all__ = ["checkpoint_offsets", "last_committed_batch", "parse_offset_log"]


def _batch_files(location: str) -> dict[int, str]:
    """Batch id -> location of the files named by a batch id in a checkpoint folder (any URI)."""
    from pyarrow import fs as pafs

    fs, root = uris.filesystem(location)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except (OSError, ValueError):   # not a folder (or unreachable): no batches
        return {}
    names = (info.base_name for info in infos if info.type == pafs.FileType.File)
    return {int(name): uris.join(location, name) for name in names if name.isdigit()}


def parse_offset_log(text: str) -> list[dict]:
    """The per-source offsets of one offset-log file's text (first line version, second metadata,
    then one line per source)."""
    out = []
    for line in text.splitlines()[2:]:
        line = line.strip()
        if not line or line == "-":
            continue
        try:
            v = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(v, str):  # a serialized offset nested as a string
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                continue
        if isinstance(v, dict):
            out.append(v)
    return out


def _source_offsets(location: str) -> list[dict]:
    return parse_offset_log(uris.read_text(location) or "")


def checkpoint_offsets(checkpoint_dir: str | os.PathLike, batch_id: int | None = None) -> dict | None:
    """End offsets (offset JSON) of a micro-batch, read from a Spark checkpoint; runs anywhere.

    Default: the last batch in ``commits/`` (fully processed). With ``batch_id``: that batch's
    planned end offsets from ``offsets/``, committed or not. None when there is no such batch.
    With several sources in one query their offsets are merged (the lower offset wins when two
    sources read the same partition, so the result never overstates progress).
    """
    cp = uris.normalize(checkpoint_dir)
    offsets = _batch_files(uris.join(cp, "offsets"))
    if batch_id is None:
        committed = _batch_files(uris.join(cp, "commits"))
        usable = sorted(b for b in committed if b in offsets)
        if not usable:
            return None
        batch_id = usable[-1]
    path = offsets.get(int(batch_id))
    if path is None:
        return None
    maps = []
    for src in _source_offsets(path):
        try:
            maps.append(offsets_to_map(src))
        except SourceError:
            continue
    merged = merge_offsets(maps)
    return map_to_offsets(merged)


def last_committed_batch(checkpoint_dir: str | os.PathLike) -> int | None:
    """The id of the last micro-batch in ``commits/``, or None."""
    committed = _batch_files(uris.join(uris.normalize(checkpoint_dir), "commits"))
    return max(committed) if committed else None
