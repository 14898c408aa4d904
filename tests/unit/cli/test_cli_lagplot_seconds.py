"""`kappa lag-plot` draws the lag in seconds in a second panel when the samples carry it."""

from __future__ import annotations

import struct



def _png_size(path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])   # IHDR width, height


def test_second_panel_only_with_lag_seconds(run, seeded, tmp_path):
    reg = seeded.registry
    for i in range(10):
        reg.add_lag_sample("standardize", 1, 1000 - 100 * i, {}, at=1_700_000_000.0 + i)
        reg.add_lag_sample("standardize", 2, 1000 - 100 * i, {}, at=1_700_000_100.0 + i,
                       lag_seconds=None if i == 3 else 90.0 - 10 * i)
    one, both = tmp_path / "v1.png", tmp_path / "both.png"
    assert run("lag-plot", "standardize", "--version", "1", "--out", str(one)).exit_code == 0
    assert run("lag-plot", "standardize", "--out", str(both)).exit_code == 0
    (w1, h1), (w2, h2) = _png_size(one), _png_size(both)
    assert w1 == w2 and h2 > h1 * 1.4      # the records panel, plus the seconds panel under it
