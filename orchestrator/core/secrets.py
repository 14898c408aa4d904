"""Secrets in settings and URLs: which values are secret, and how they are shown.

The one place kappa decides what to hide. librdkafka settings whose names say they hold a
secret (`sasl.password`, `ssl.key.password`, `*.secret`, tokens, JAAS and OAUTHBEARER configs,
PEM keys) are kept as `SecretStr` in `Settings` and revealed only for the clients that need them;
database URLs (the registry's, Airflow's metadata database) are shown with their password as ***.

A job gets the Kafka config from a 0600 file (`--kafka-config-file`), never on its command line,
where any user could read it in /proc/<pid>/cmdline. Text kappa did not compose itself (a job's
log tail, the error a job reported) may still hold a secret a library printed: `mask_secrets`
replaces every secret value of the settings with *** before such text goes into an error
message, the registry, the audit log or a status.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import SecretStr

__all__ = ["MASK", "is_secret_key", "mask_secrets", "mask_url", "reveal", "secret_values"]

MASK = "***"

_SECRET_KEY = re.compile(r"password|secret|token|credential|jaas|oauthbearer\.config|\.pem$", re.I)
_URL_PASSWORD = re.compile(r"(://[^:/@]+:)[^@]*@")


def is_secret_key(key: str) -> bool:
    """Whether a librdkafka setting holds a secret (password, token, private key...)."""
    return _SECRET_KEY.search(key) is not None


def mask_url(url: str) -> str:
    """The URL with its password replaced by ***, for messages, logs and state files.

    A string SQLAlchemy cannot parse still has anything shaped like `://user:password@` masked,
    so a malformed URL in an error message does not leak its password either.
    """
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return _URL_PASSWORD.sub(r"\1***@", str(url))


def reveal(value: Any) -> Any:
    """The plain value of a `SecretStr` (anything else unchanged), for a client that needs it."""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def secret_values(settings: Any) -> list[str]:
    """The plain secrets of `settings` (a `Settings`): the kafka_config values under secret keys and
    the registry URL's password, longest first (so a secret that contains another is masked whole)."""
    found = {str(reveal(v)) for key, v in (getattr(settings, "kafka_config", None) or {}).items()
             if isinstance(v, SecretStr) or is_secret_key(key)}
    url = getattr(settings, "registry_url", None)
    if url:
        try:
            from sqlalchemy.engine import make_url

            password = make_url(url).password
        except Exception:
            password = None
        if password:
            found.add(str(password))
    return sorted((v for v in found if v), key=len, reverse=True)


def mask_secrets(text: Any, settings: Any) -> Any:
    """`text` with every secret of `settings` replaced by ***, also in its JSON-escaped form
    (as it appears in a JSON file or a logged dict). None and '' come back as they are."""
    if not text or settings is None:
        return text
    out = str(text)
    for secret in secret_values(settings):
        out = out.replace(secret, MASK)
        escaped = json.dumps(secret)[1:-1]
        if escaped != secret:
            out = out.replace(escaped, MASK)
    return out
