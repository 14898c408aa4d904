"""`kappa lag-plot` on synthetic lag samples in a real (SQLite) registry."""

from __future__ import annotations

from orchestrator.observe.lagplot import PNG_SIGNATURE, Series, is_png, plot_lag


def _catch_up(reg, version: int, start: float, backlog: int, unknown_at: int | None = None) -> None:
    """A backlog worked off in 20 samples, then a tail that hovers at the live rate."""
    for i in range(25):
        total = max(0, backlog - i * backlog // 20) + (40 if i >= 20 else 0)
        reg.add_lag_sample("standardize", version, None if i == unknown_at else total,
                           {"member_profiles:0": total}, at=start + i * 2.0)


def test_lag_plot_writes_a_png(run, seeded, tmp_path):
    reg = seeded.registry
    _catch_up(reg, 1, 1_700_000_000.0, 300_000)
    _catch_up(reg, 2, 1_700_000_300.0, 310_000, unknown_at=3)
    out = tmp_path / "plots" / "catchup.png"
    result = run("lag-plot", "standardize", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000
    assert is_png(out)


def test_lag_plot_default_path_and_one_version(run, seeded, home):
    _catch_up(seeded.registry, 2, 1_700_000_000.0, 1_000)
    result = run("lag-plot", "standardize", "--version", "2")
    assert result.exit_code == 0, result.output
    assert is_png(home / "plots" / "standardize-lag.png")


def test_lag_plot_without_samples_is_an_error(run, seeded, tmp_path):
    out = tmp_path / "x.png"
    result = run("lag-plot", "standardize", "--out", str(out))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no lag samples to plot")
    assert not out.exists()


def test_lag_plot_unknown_version(run, seeded):
    result = run("lag-plot", "standardize", "--version", "9")
    assert result.exit_code == 1
    assert "has no version 9" in result.stderr and "v1, v2" in result.stderr


def test_plot_lag_with_only_unknown_samples(tmp_path):
    out = plot_lag([Series("p v1", [(0.0, None), (2.0, None)])], tmp_path / "u.png")
    assert is_png(out)
