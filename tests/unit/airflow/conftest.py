"""Airflow unit tests: an AIRFLOW_HOME of their own, set before anything imports Airflow.

Airflow reads its configuration once, at import; without this, importing the DAGs would
create ~/airflow. The integration conftest does the same and both share one directory
(KAPPA_TEST_AIRFLOW_HOME), whichever loads first.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from orchestrator.airflow.stack import airflow_env

if not os.environ.get("KAPPA_TEST_AIRFLOW_HOME"):
    os.environ["KAPPA_TEST_AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="kappa-airflow-test-")
    atexit.register(shutil.rmtree, os.environ["KAPPA_TEST_AIRFLOW_HOME"], True)
os.environ.update(airflow_env(Path(os.environ["KAPPA_TEST_AIRFLOW_HOME"])))
