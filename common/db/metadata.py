"""The one SQLAlchemy metadata every table of the schema is declared on (common/db/schema.py and
common/db/schema_distribution.py), so Alembic compares the migrations against all of them."""

from __future__ import annotations

from sqlalchemy import MetaData

# Deterministic constraint names keep autogenerate comparisons and
# hand-written migrations in agreement.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)
