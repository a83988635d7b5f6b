"""Deterministic row ids and the strict user-id pattern that keeps filters injection-free."""
from __future__ import annotations

import hashlib
import re
import uuid
from datetime import datetime, timezone

from memory.errors import InvalidUserIdError

#: a whole user id (used with `fullmatch`: `$` alone would also accept a trailing newline)
USER_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


def make_id(*parts: object) -> str:
    """A stable 32-hex id from its parts (user, sources, content, stage version...)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(str(part).encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
    return h.hexdigest()


def new_run_id(kind: str) -> str:
    """A run's id: its kind, the UTC time to the second and 6 random hex digits (`ingest-20240301T120000-1a2b3c`)."""
    return f"{kind}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def progress_id(user: str, session_id: str | None) -> str:
    """The id of a `progress` row: one per consolidated session, and one per user (`session_id` None)."""
    return make_id("progress", user, session_id or "")


def validate_user_id(user_id: object) -> str:
    """Return the id unchanged if it is a safe user id, else raise InvalidUserIdError."""
    if not isinstance(user_id, str) or not USER_ID_PATTERN.fullmatch(user_id):
        raise InvalidUserIdError(user_id)
    return user_id
