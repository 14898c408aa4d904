"""Secrets in settings and URLs: which values are secret, and how they are shown.

The one place kappa decides what to hide. librdkafka settings whose names say they hold a
secret (`sasl.password`, `ssl.key.password`, `*.secret`, tokens, JAAS and OAUTHBEARER configs,
PEM keys) are kept as `SecretStr` in `Settings` and revealed only for the clients that need them;
database URLs (the registry's, Airflow's metadata database) are shown with their password as ***.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import SecretStr

__all__ = ["is_secret_key", "mask_url", "reveal"]

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
