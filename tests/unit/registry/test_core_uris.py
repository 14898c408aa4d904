"""`orchestrator.core.uris`: locations are URI strings or absolute paths, never pathlib, and every file
operation goes through pyarrow's filesystems, so a warehouse on an object store is handled like a local one.

An object store is stood in for by a pyarrow SubTreeFileSystem under tmp_path, mapped to `s3://bucket/…`
(and `hdfs://nn/…` for a filesystem that is neither local nor an object store): no network, but the code
under test sees only the URI and the filesystem pyarrow would give it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyarrow import fs as pafs

from orchestrator.core import uris
from orchestrator.core.exceptions import ConfigError
from orchestrator.core.paths import alias_pointer_path, version_paths


@pytest.fixture
def remote(tmp_path, monkeypatch) -> Path:
    """`s3://bucket/…` and `hdfs://nn/…` served from tmp_path/remote; returns that folder."""
    root = tmp_path / "remote"
    root.mkdir()
    real = uris.filesystem

    def filesystem(location):
        loc = uris.normalize(location)
        for prefix in ("s3://", "hdfs://"):
            if loc.startswith(prefix):
                return pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem()), loc[len(prefix):]
        return real(location)

    monkeypatch.setattr(uris, "filesystem", filesystem)
    return root


@pytest.mark.parametrize("given, expected", [
    ("s3://bucket/wh/", "s3://bucket/wh"),
    ("gs://b/wh", "gs://b/wh"),
    ("abfss://c@acct.dfs.core.windows.net/wh", "abfss://c@acct.dfs.core.windows.net/wh"),
    ("hdfs://nn:8020/wh//", "hdfs://nn:8020/wh"),
    ("file:///tmp/wh/", "file:///tmp/wh"),
    ("file:/tmp/wh", "file:///tmp/wh"),          # how Hadoop prints a local URI
    ("file:///", "file:///"),
    ("/tmp/a/../wh/", "/tmp/wh"),
])
def test_normalize_keeps_uris_and_makes_paths_absolute(given, expected):
    assert uris.normalize(given) == expected


def test_normalize_takes_a_path_or_a_relative_string(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert uris.normalize(Path("wh")) == uris.normalize("wh") == str(tmp_path / "wh")
    assert uris.normalize("~/wh") == os.path.expanduser("~/wh")


@pytest.mark.parametrize("bad, message", [
    ("s3:/bucket/wh", "looks like a URI that lost its '//' (was it passed through pathlib.Path?); give it as "
                      "s3://bucket/wh"),
    ("s3://", "names no bucket or host"),
    ("", "a location must be a non-empty path or URI"),
])
def test_normalize_refuses_what_it_cannot_trust(bad, message):
    with pytest.raises(ConfigError) as e:
        uris.normalize(bad)
    assert message in str(e.value)


def test_join_appends_segments_as_strings():
    assert uris.join("s3://bucket/wh/", "pipe", "v1") == "s3://bucket/wh/pipe/v1"
    assert uris.join("file:///", "wh", "offsets/3") == "file:///wh/offsets/3"
    assert uris.join(Path("/tmp/wh"), "pipe", "v1__rejects") == "/tmp/wh/pipe/v1__rejects"
    assert uris.join("/", "wh") == "/wh"
    for bad in ("", "/abs", "a/../b", "a//b", "."):
        with pytest.raises(ConfigError, match="cannot join"):
            uris.join("s3://bucket/wh", bad)


def test_local_path_only_for_local_locations(tmp_path):
    assert uris.local_path(f"file://{tmp_path}/wh") == tmp_path / "wh"
    assert uris.local_path(tmp_path / "wh") == tmp_path / "wh"
    assert uris.local_path("file://localhost/tmp/wh") == Path("/tmp/wh")
    assert uris.local_path("file://otherhost/tmp/wh") is None
    assert uris.local_path("s3://bucket/wh") is None
    assert (uris.is_local("file:///x"), uris.is_local("/x"), uris.is_local("gs://b/x")) == (True, True, False)
    assert (uris.scheme("S3://b/x"), uris.scheme("/x"), uris.scheme(Path("/x"))) == ("s3", None, None)


def test_filesystem_of_a_file_uri_and_of_a_path_is_the_local_one(tmp_path):
    for location in (f"file://{tmp_path}/t", str(tmp_path / "t"), tmp_path / "t"):
        fs, path = uris.filesystem(location)
        assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path / "t")


@pytest.mark.parametrize("form", ["path", "file-uri"])
def test_local_write_read_size_and_delete(tmp_path, form):
    base = str(tmp_path / "wh") if form == "path" else f"file://{tmp_path}/wh"
    pointer = uris.join(base, "_aliases", "a.json")
    assert uris.read_bytes(pointer) is None and not uris.exists(pointer)
    uris.write_atomic(pointer, '{"v": 1}\n')
    uris.write_atomic(pointer, b'{"v": 2}\n')
    assert uris.read_text(pointer) == '{"v": 2}\n' and uris.exists(pointer)
    on_disk = tmp_path / "wh" / "_aliases" / "a.json"
    assert stat.S_IMODE(on_disk.stat().st_mode) == 0o644
    assert sorted(p.name for p in on_disk.parent.iterdir()) == ["a.json"]   # no temporary file left
    table = uris.join(base, "pipe", "v1")
    (tmp_path / "wh" / "pipe" / "v1" / "_delta_log").mkdir(parents=True)
    (tmp_path / "wh" / "pipe" / "v1" / "_delta_log" / "0.json").write_bytes(b"x" * 10)
    (tmp_path / "wh" / "pipe" / "v1" / "part-0.parquet").write_bytes(b"y" * 32)
    assert uris.size(table) == 42 and uris.size(pointer) == 9 and uris.size(uris.join(base, "none")) == 0
    assert uris.delete_tree(table) is True
    assert not (tmp_path / "wh" / "pipe" / "v1").exists() and (tmp_path / "wh" / "pipe").is_dir()
    assert uris.delete_tree(table) is False                                    # idempotent
    assert uris.delete_tree(pointer) is True and not on_disk.exists()


def test_an_object_store_location_is_written_with_one_put_and_deleted_through_pyarrow(remote):
    pointer = "s3://bucket/wh/_aliases/a.json"
    (remote / "bucket" / "wh" / "_aliases").mkdir(parents=True)  # a local stand-in needs the folder
    uris.write_atomic(pointer, '{"v": 1}\n')
    assert (remote / "bucket" / "wh" / "_aliases" / "a.json").read_text() == '{"v": 1}\n'
    assert uris.read_text(pointer) == '{"v": 1}\n' and uris.exists("s3://bucket/wh")
    assert uris.read_bytes("s3://bucket/wh/_aliases/none.json") is None
    assert uris.size("s3://bucket/wh") == 9
    assert uris.delete_tree("s3://bucket/wh") is True and not (remote / "bucket" / "wh").exists()
    assert not uris.exists(pointer)


def test_another_filesystem_gets_a_temporary_file_moved_over_the_target(remote):
    target = "hdfs://nn/wh/_aliases/a.json"
    uris.write_atomic(target, "one\n")
    uris.write_atomic(target, "two\n")
    folder = remote / "nn" / "wh" / "_aliases"
    assert (folder / "a.json").read_text() == "two\n"
    assert sorted(p.name for p in folder.iterdir()) == ["a.json"]


def test_version_paths_and_the_pointer_follow_a_uri_warehouse(tmp_path):
    settings = SimpleNamespace(warehouse="s3://bucket/wh/", state_dir=tmp_path / "state", group_prefix="kappa")
    p = version_paths(settings, "standardize", 3)
    assert (p.table, p.rejects) == ("s3://bucket/wh/standardize/v3", "s3://bucket/wh/standardize/v3__rejects")
    assert p.checkpoint == str(tmp_path / "state" / "standardize" / "v3" / "checkpoint")   # default: state dir
    assert p.run_dir == tmp_path / "state" / "standardize" / "v3" / "run" and p.status_file.name == "status.json"
    assert alias_pointer_path(settings.warehouse, "served") == "s3://bucket/wh/_aliases/served.json"
    shared = SimpleNamespace(**vars(settings), checkpoints="gs://ckpt/kappa")
    assert version_paths(shared, "standardize", 3).checkpoint == "gs://ckpt/kappa/standardize/v3/checkpoint"


def test_the_alias_pointer_round_trips_on_an_object_store(remote):
    from orchestrator.serving import read_pointer, write_pointer

    location = alias_pointer_path("s3://bucket/wh", "served")
    (remote / "bucket" / "wh" / "_aliases").mkdir(parents=True)
    assert read_pointer(location) is None
    pointer = {"alias": "served", "pipeline": "p", "version": 2, "table": "s3://bucket/wh/p/v2"}
    write_pointer(location, pointer)
    assert read_pointer(location, strict=True) == pointer
    assert (remote / "bucket" / "wh" / "_aliases" / "served.json").read_text().endswith("}\n")
