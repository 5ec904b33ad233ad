"""The store fixtures (:mod:`.store_fixtures`): each test on SQLite and on Postgres."""

from .store_fixtures import (  # noqa: F401 - fixtures, found here by pytest
    backend,
    backend_spec,
    pg,
    pg_spec,
    postgres_dsn,
    store,
)
