"""A team's repository for the tests of bring-your-own pipelines: a job package outside kappa
(`team_jobs.accounts`, written to the job contract with nothing of kappa's but its types), a rules
location with a ruleset `plans` (format 2: its section names its column), and the test data with an
expected table computed here, from the records and the test's own mapping of the plans.

The job reads accounts (JSON values keyed by account id: owner, plan), rejects values that are not
accounts, deletes on tombstones, and applies the version's rules on the latest row of each account.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from orchestrator.dev import datagen

ACCOUNTS_JOB = '''\
"""Accounts with their plan standardized by the rules: a job of kappa's job contract."""
from pyspark.sql import functions as F

from jobs.lib.contract.api import JobInput, Upserts


def transform(job: JobInput) -> Upserts:
    value = F.col("value").cast("string")
    account = F.from_json(value, "owner string, plan string")
    malformed = F.col("value").isNotNull() & (account.isNull() | account["owner"].isNull())
    rows = job.source.select(
        "*", F.col("key").cast("string").alias("account_id"), account["owner"].alias("owner"),
        account["plan"].alias("plan_raw"),
        F.when(malformed, F.concat(F.lit("not an account: "), value)).alias("error"),
        F.col("value").isNull().alias("_deleted"))
    return Upserts(rows, then=job.rules.apply if job.rules is not None else None)
'''

RAW_PLANS = ["free", "Free tier", "pro", "professional", "team", "teams"]
#: What each rules version of `plans` makes of the raw plans (the test's own reading of the files below).
PLANS = {
    "v1": {"free": "Free", "Free tier": "Free", "pro": "Pro", "professional": "Pro", "team": "Team", "teams": "Team"},
    "v2": {"free": "Free", "Free tier": "Free", "pro": "Pro", "professional": "Pro", "team": "Business",
           "teams": "Business"},
    "v3": {"free": "Starter", "Free tier": "Starter", "pro": "Pro", "professional": "Pro", "team": "Business",
           "teams": "Business"},
}


def plans_rules(version: str) -> str:
    canon: dict[str, list[str]] = {}
    for raw, c in PLANS[version].items():
        canon.setdefault(c, []).append(raw)
    lines = [f'format_version = 2\ndescription = "plans {version}"\n\n[plans]\ncolumn = "plan"\nunmatched = "keep"\n',
             "[plans.aliases]"]
    lines += [f"{json.dumps(c)} = {json.dumps(sorted(raws))}" for c, raws in canon.items()]
    return "\n".join(lines) + "\n"


def write_team_repo(root: Path) -> tuple[Path, Path]:
    """(the job path folder, the rules location): `team_jobs/accounts.py`; `plans/v1..v3.toml`, and a
    copy of kappa's shipped `titles` rules so that the standardize pipelines of a test bed keep theirs."""
    from jobs.lib.rules.files import RULES_DIR

    repo, rules = root / "team-repo", root / "team-repo" / "rules"
    (repo / "team_jobs").mkdir(parents=True)
    (repo / "team_jobs" / "__init__.py").write_text("")
    (repo / "team_jobs" / "accounts.py").write_text(ACCOUNTS_JOB)
    (rules / "plans").mkdir(parents=True)
    for v in PLANS:
        (rules / "plans" / f"{v}.toml").write_text(plans_rules(v))
    shutil.copytree(RULES_DIR / "titles", rules / "titles")
    return repo, rules


def accounts(n: int, keys: int, seed: int) -> list[datagen.ChangeRecord]:
    """Creates, updates, deletes and malformed values over `keys` accounts (a key's partition is its hash)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        key = f"acct{rng.randrange(keys):03d}".encode()
        roll = rng.random()
        if roll < 0.08:
            out.append(datagen.ChangeRecord(key=key, value=None, kind="tombstone"))
        elif roll < 0.13:
            out.append(datagen.ChangeRecord(key=key, value=b"{not json", kind="invalid_json"))
        else:
            value = {"owner": f"o{rng.randrange(9)}", "plan": rng.choice(RAW_PLANS)}
            out.append(datagen.ChangeRecord(key=key, value=json.dumps(value).encode(), kind="upsert"))
    return out


def expected_accounts(log, rules_version: str) -> tuple[dict, list]:
    """({account_id: (owner, plan_raw, plan)}, [(partition, offset) of rejects]) from the log as read:
    per key the last record by offset (a key lives in one partition), tombstones delete."""
    table, rejects = {}, []
    for r in sorted(log, key=lambda r: (r.partition, r.offset)):
        key = r.key.decode()
        if r.value is None:
            table.pop(key, None)
            continue
        try:
            v = json.loads(r.value)
            ok = isinstance(v, dict) and v.get("owner") is not None
        except ValueError:
            ok = False
        if not ok:
            rejects.append((r.partition, r.offset))
            continue
        table[key] = (v["owner"], v["plan"], PLANS[rules_version][v["plan"]])
    return table, sorted(rejects)
