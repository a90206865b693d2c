"""A table that refuses deletes, as a full disk makes a database refuse them: a trigger,
written once per dialect, so the failure comes from the real database."""

from __future__ import annotations

import sqlalchemy as sa

MESSAGE = "disk full stand-in"


def refuse_deletes(engine: sa.Engine, table: str, dialect: str) -> None:
    name = f"refuse_{table}"
    statements = {
        "sqlite": [
            f"CREATE TRIGGER {name} BEFORE DELETE ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        ],
        "postgresql": [
            f"CREATE FUNCTION {name}() RETURNS trigger AS "
            f"$$ BEGIN RAISE EXCEPTION '{MESSAGE}'; END $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER {name} BEFORE DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {name}()",
        ],
        "mariadb": [
            f"CREATE TRIGGER {name} BEFORE DELETE ON {table} FOR EACH ROW "
            f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{MESSAGE}'"
        ],
    }[dialect]
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)


def allow_deletes(engine: sa.Engine, table: str, dialect: str) -> None:
    name = f"refuse_{table}"
    on = f" ON {table}" if dialect == "postgresql" else ""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TRIGGER {name}{on}")
