"""The job the model-based and stress tests start: makes the version's outputs, then becomes fake_job.py.

    python model_job.py --table T --checkpoint C --template X [--start-delay S] -- python fake_job.py --run-dir R ...

A real job's first micro-batch creates its Delta table and its checkpoint; this one copies a
small template table to T (unless T holds a table already: a restart keeps it) and creates C,
then, after `--start-delay` seconds (a loaded machine's slow start), `exec`s the fake job, so the
launched PID stays the job's PID (kappa's launch record and the process the tests scan for are
the same process).
"""

import os
import shutil
import sys
import time
from pathlib import Path


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--")
    opts = dict(zip(argv[:split:2], argv[1:split:2]))
    table, checkpoint = Path(opts["--table"]), Path(opts["--checkpoint"])
    if not (table / "_delta_log").exists():
        shutil.copytree(opts["--template"], table, dirs_exist_ok=True)
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    time.sleep(float(opts.get("--start-delay", 0)))
    rest = argv[split + 1:]
    os.execv(rest[0], rest)


if __name__ == "__main__":
    main()
