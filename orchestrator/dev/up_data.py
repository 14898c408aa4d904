"""Which declared pipelines `kappa up` offers in Airflow's trigger form: those whose source topics hold data.

`kappa up` starts a fresh embedded broker and fills only its demo topics (`member_profiles` and the
seed pipelines' topics). A pipelines file of one's own (`--pipelines-file`) may name other topics;
a reprocess of such a pipeline could only fail (its topic does not exist), so the form leaves it
out, and `kappa up` says which and why. Airflow then reads a copy of the pipelines file with only
the pipelines offered (`<home>/pipelines.up.toml`); the file given is not changed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterable

from orchestrator.core.exceptions import BrokerError, KappaError

__all__ = ["topic_records", "pipelines_without_data", "write_pipelines_subset"]

#: The header of a pipeline's table or of one of its sub-tables: `[pipelines.<name>]`, `[pipelines.<name>.options]`.
_HEADER = re.compile(r'^\s*\[\[?\s*pipelines\s*\.\s*"?([A-Za-z0-9_-]+)"?\s*[\].]')
_OTHER_HEADER = re.compile(r"^\s*\[")


def topic_records(k, topics: Iterable[str]) -> dict[str, int | None]:
    """Records each topic holds now (log end minus log start over its partitions); None if it does not exist."""
    from orchestrator.observe import lag

    topics = sorted(set(topics))
    try:
        existing = set(k.admin().list_topics(timeout=10).topics)
    except KappaError:
        raise
    except Exception as e:
        raise BrokerError(f"cannot list the topics on {k.bootstrap_servers}: {e}") from None
    offsets = lag.log_offsets(k, [t for t in topics if t in existing])
    records: dict[str, int | None] = {t: (0 if t in existing else None) for t in topics}
    for (topic, _partition), (start, end) in offsets.items():
        records[topic] += end - start
    return records


def pipelines_without_data(k, lookup: Callable[..., dict[str, int | None]] | None = None) -> dict[str, list[str]]:
    """{pipeline: why} of the declared pipelines with a source topic that is missing or empty, in file order.
    `lookup(k, topics)` gives the records of each topic (default `topic_records`, from the broker)."""
    specs = k.pipelines
    records = (lookup or topic_records)(k, [t for spec in specs.values() for t in spec.topics])
    out: dict[str, list[str]] = {}
    for name, spec in specs.items():
        why = [f"topic {t!r} does not exist" if records.get(t) is None else f"topic {t!r} is empty"
               for t in spec.topics if not records.get(t)]
        if why:
            out[name] = why
    return out


def write_pipelines_subset(src: Path, dst: Path, keep: Iterable[str]) -> Path | None:
    """Write `src` without the tables of the pipelines not in `keep`, comments and formatting as they are.

    Returns `dst`, or None (nothing written) where the file declares its pipelines in a way this
    line-wise cut does not follow (dotted keys, inline tables): the copy must declare exactly `keep`.
    """
    from orchestrator.core.files import write_atomic
    from orchestrator.core.pipelines import load_pipelines

    keep = list(keep)
    lines, dropping = [], False
    for line in Path(src).read_text(encoding="utf-8").splitlines(keepends=True):
        header = _HEADER.match(line)
        if header:
            dropping = header.group(1) not in keep
        elif _OTHER_HEADER.match(line):
            dropping = False
        if not dropping:
            lines.append(line)
    write_atomic(dst, "".join(lines))
    try:
        ok = list(load_pipelines(dst)) == keep
    except KappaError:
        ok = False
    if not ok:
        dst.unlink(missing_ok=True)
        return None
    return dst
