"""Airflow UI/API users of the simple auth manager and their generated passwords.

Airflow's simple auth manager prints a password to stdout (and so into every log) whenever it
has to generate one. We write the passwords file ourselves, owner-only, before any Airflow
component starts: Airflow then finds every user already there and prints nothing.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

# user -> simple auth manager role. `op` may trigger DAGs (and edit pools, variables,
# connections); `viewer` reads everything and changes nothing; `admin` manages the rest.
SCALE_OUT_USERS = {"admin": "admin", "operator": "op", "viewer": "viewer"}
EMBEDDED_USERS = {"admin": "admin"}


def users_setting(users: dict[str, str]) -> str:
    """The `[core] simple_auth_manager_users` value: `name:role,name:role`."""
    return ",".join(f"{name}:{role}" for name, role in users.items())


def ensure_passwords(file: Path, users: dict[str, str]) -> Path:
    """Create (or complete) the passwords file with one random password per missing user; 0600."""
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(file.read_text() or "{}") if file.exists() else {}
    missing = {u: secrets.token_urlsafe(18) for u in users if u not in current}
    if missing or not file.exists():
        tmp = file.with_name(file.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({**current, **missing}, f)
        os.replace(tmp, file)
    os.chmod(file, 0o600)  # also when an older file was created more open
    return file


def password(file: Path, user: str) -> str:
    return json.loads(Path(file).read_text())[user]
