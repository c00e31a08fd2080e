"""What the PostgreSQL store's statement modules share: the connection type, and JSON."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

# Connections hand rows out as tuples (psycopg's default row factory).
Connection = psycopg.AsyncConnection[tuple[Any, ...]]


def jsonb(value: Any) -> Jsonb:
    """`value` as a jsonb parameter."""
    return Jsonb(value)
