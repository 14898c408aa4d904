"""Validation of the names that become paths, consumer groups, Delta app ids and table names.

A pipeline or alias name ends up in `<warehouse>/<pipeline>/v<N>`, `<state>/<pipeline>/...`,
`<group_prefix>.<pipeline>.v<N>` and `<warehouse>/_aliases/<alias>.json`, so it must not be able
to escape a directory, hold a space or a separator, or grow without bound. One rule serves all
of them: `^[a-z][a-z0-9_]{0,62}$`.

Topic names follow Kafka's own rule (`[a-zA-Z0-9._-]`, 1 to 249 characters, not `.` or `..`);
they never become paths here, but a comma would split the source's `topics` option.

Every check raises `ConfigError` naming the field, the value and the rule, and returns the
value unchanged when it is valid, so it can be used inline:
`validate_pipeline_name(name)`.

"""

from __future__ import annotations

import keyword
import re

from orchestrator.core.exceptions import ConfigError

__all__ = ["NAME_PATTERN", "NAME_RULE", "TOPIC_PATTERN", "TOPIC_RULE", "validate_alias_name",
           "validate_job_name", "validate_name", "validate_pipeline_name", "validate_topic_name",
           "validate_version_number"]

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
NAME_RULE = ("a lowercase letter followed by at most 62 lowercase letters, digits or underscores "
             "(^[a-z][a-z0-9_]{0,62}$)")

TOPIC_PATTERN = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
TOPIC_RULE = "1 to 249 characters from a-z, A-Z, 0-9, '.', '_', '-', and not '.' or '..' (Kafka's rule)"


def _describe(value: object) -> str:
    if isinstance(value, str):
        shown = value if len(value) <= 80 else value[:77] + "..."
        return repr(shown)
    return f"{value!r} (a {type(value).__name__}, not a string)"


def validate_name(value: object, *, field: str) -> str:
    """Check a name that becomes part of a path, a consumer group or an app id."""
    if not isinstance(value, str) or NAME_PATTERN.fullmatch(value) is None:
        raise ConfigError(f"invalid {field} {_describe(value)}: must be {NAME_RULE}")
    return value


def validate_pipeline_name(value: object, field: str = "pipeline") -> str:
    return validate_name(value, field=f"{field} name" if field == "pipeline" else field)


def validate_alias_name(value: object, field: str = "alias") -> str:
    return validate_name(value, field=f"{field} name" if field == "alias" else field)


def validate_job_name(value: object, field: str = "job") -> str:
    """A job names a function of the job contract: ``module:function``, a module (its `transform`), or
    one of kappa's own jobs by name (``standardize``). Dotted Python identifiers, no keyword."""
    import re

    ok = isinstance(value, str) and re.fullmatch(
        r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?", value) is not None
    if not ok:
        raise ConfigError(f"invalid {field} {value!r}: name a Python module or module:function, such as "
                          f"team_jobs.profiles:transform, or one of kappa's jobs such as standardize")
    words = [w for part in value.split(":") for w in part.split(".")]  # type: ignore[union-attr]
    bad = [w for w in words if keyword.iskeyword(w)]
    if bad:
        raise ConfigError(f"invalid {field} {value!r}: the Python keyword {bad[0]!r} cannot be part of a module "
                          f"or function name")
    return value  # type: ignore[return-value]


def validate_topic_name(value: object, field: str = "topic") -> str:
    if (not isinstance(value, str) or TOPIC_PATTERN.fullmatch(value) is None
            or value in (".", "..")):
        name = f"{field} name" if field == "topic" else field
        raise ConfigError(f"invalid {name} {_describe(value)}: must be {TOPIC_RULE}")
    return value


def validate_version_number(value: object, field: str = "version") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"invalid {field} {value!r}: must be a positive integer (1, 2, ...)")
    return value
