"""A stand-in for a kappa job process that follows the runtime's contract without Spark.

    python fake_job.py --run-dir DIR [--behaviour normal|slow-stop|ignore-stop|ignore-term|crash|fail|hang]

normal: status.json starting -> running, heartbeat every 0.1 s; the STOP file or SIGTERM -> stopped, exit 0.
slow-stop: on the STOP file, keeps heartbeating for 1 s, and for as long as a HOLD file exists in the run
    dir (a test holds the job there), then stops like normal (a Spark job finishing its micro-batch).
ignore-stop: ignores the STOP file (SIGTERM still stops it).
ignore-term: ignores the STOP file and SIGTERM (only SIGKILL ends it).
crash: exits with code 3 at once, its last status 'starting' (no final status).
fail: reports state failed with an error, exit 1.
hang: stops heartbeating after the first status (process stays alive).
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--behaviour", default="normal")
    a, _ = p.parse_known_args()
    run = Path(a.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    status = {"pipeline": "p", "version": 1, "pid": os.getpid(), "state": "starting", "started_at": time.time(),
              "heartbeat_at": time.time(), "batch_id": None, "batches": 0, "rows_in": 0, "rows_out": 0,
              "rejects": 0, "end_offsets": None, "error": None, "rules_hash": None}
    write(run / "status.json", status)
    print("fake job starting", flush=True)
    stop = {"term": False}

    def on_term(signum, frame):
        stop["term"] = True

    signal.signal(signal.SIGTERM, signal.SIG_IGN if a.behaviour == "ignore-term" else on_term)
    if a.behaviour == "crash":
        print("fake job crashing: something broke", flush=True)
        return 3
    if a.behaviour == "fail":
        status.update(state="failed", error="RulesError: bad rule", heartbeat_at=time.time())
        write(run / "status.json", status)
        print("fake job failed: RulesError: bad rule", flush=True)
        return 1
    status.update(state="running")
    n = 0
    stop_seen: float | None = None
    while True:
        if stop_seen is None and (run / "STOP").exists():
            stop_seen = time.monotonic()
        slow = a.behaviour == "slow-stop" and stop_seen is not None and (
            time.monotonic() - stop_seen < 1.0 or (run / "HOLD").exists())
        if stop["term"] or (stop_seen is not None and a.behaviour in ("normal", "slow-stop") and not slow):
            status.update(state="stopped", heartbeat_at=time.time())
            write(run / "status.json", status)
            print("fake job stopped", flush=True)
            return 0
        if a.behaviour != "hang" or n == 0:
            n += 1
            status.update(heartbeat_at=time.time(), batch_id=n, batches=n)
            write(run / "status.json", status)
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
