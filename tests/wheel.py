"""kappa's wheel, built by the tests that need the installed package rather than the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_wheel(src: Path, out: Path) -> Path:
    """Build kappa's wheel from a copy of the checkout in `src` (the build leaves build/ and
    *.egg-info behind) into `out`; the wheel's path."""
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("orchestrator", "jobs", "deploy", "dags"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("kappa-*.whl")
    return built
