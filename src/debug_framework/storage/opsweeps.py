"""Conformance sweeps of a backend, operator by operator (schema version 6).

``op_sweeps`` holds one row per sweep: its key (a digest of what was swept: the backend, the device,
the dtypes, forward or backward, the seed), the backend's name and its settings. ``op_sweep_results``
holds one row per operator of a sweep: its verdict, ``passed`` (NULL for an operator that was
skipped or that the backend does not accept), the pass rate over the samples that apply, the worst
sample, the path of that sample's standalone repro, and the counts. A sweep that is run again with
the same key skips every operator that already has a row, so an interrupted sweep resumes.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..jsonio import JsonObject
from .core import Row, SqlCore
from .dialect import Connection, Dialect
from .values import decode_json_columns, to_json, utc_now

__all__ = ["OpSweepStore", "opsweep_tables", "OP_VERDICTS"]

#: An operator's verdict: ``pass``; ``fail`` (a sample outside the calibrated bound, or a wrong shape
#: or dtype); ``error`` (the compiled call raised where eager does not); ``crash`` / ``hang`` (the
#: worker died or ran out of time); ``unsupported`` (the backend or the capture refused every
#: sample); ``skipped`` (not judged: random, uninitialised or non-numeric output, or no sample).
OP_VERDICTS = ("pass", "fail", "error", "crash", "hang", "unsupported", "skipped")


def opsweep_tables(d: Dialect) -> tuple[str, ...]:
    """Version 6's new tables and index."""
    j = d.json_type
    verdicts = ", ".join(f"'{v}'" for v in OP_VERDICTS)  # constants of this module
    return (
        f"""CREATE TABLE op_sweeps (
        sweep_key  TEXT PRIMARY KEY,
        backend    TEXT NOT NULL,
        device     TEXT NOT NULL,
        settings   {j} NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
        f"""CREATE TABLE op_sweep_results (
        sweep_key      TEXT NOT NULL REFERENCES op_sweeps(sweep_key) ON DELETE CASCADE,
        op             TEXT NOT NULL,
        verdict        TEXT NOT NULL CHECK (verdict IN ({verdicts})),
        passed         INTEGER,
        pass_rate      REAL,
        reason         TEXT,
        worst          {j},
        repro          TEXT,
        repro_verified INTEGER NOT NULL DEFAULT 0,
        counts         {j},
        seconds        REAL,
        created_at     TEXT NOT NULL,
        PRIMARY KEY (sweep_key, op)
    )""",
        "CREATE INDEX IF NOT EXISTS idx_op_sweep_results_verdict ON op_sweep_results(sweep_key, verdict)",
    )


def _row(row: Row) -> JsonObject:
    out = decode_json_columns(dict(row), ("worst", "counts", "settings"))
    if "passed" in out:
        out["passed"] = None if out["passed"] is None else bool(out["passed"])
    if "repro_verified" in out:
        out["repro_verified"] = bool(out["repro_verified"])
    return out


class OpSweepStore:
    """Sweeps by key, and each sweep's per-operator rows."""

    def __init__(self, core: SqlCore) -> None:
        self.core = core

    def start(self, sweep_key: str, backend: str, device: str, settings: Mapping[str, object]) -> None:
        """Record a sweep (its row is kept, with its results, when it already exists)."""
        def do(c: Connection) -> None:
            now = utc_now()
            if self.core.execute(c, "SELECT 1 FROM op_sweeps WHERE sweep_key = ?", (sweep_key,)).fetchone() is None:
                self.core.execute(c, "INSERT INTO op_sweeps (sweep_key, backend, device, settings, created_at,"
                                     " updated_at) VALUES (?,?,?,?,?,?)",
                                  (sweep_key, backend, device, to_json(dict(settings)), now, now))
            else:
                self.core.execute(c, "UPDATE op_sweeps SET updated_at = ? WHERE sweep_key = ?", (now, sweep_key))

        self.core.run_in_transaction(do, f"record op sweep {sweep_key}")

    def put(self, sweep_key: str, result: Mapping[str, object]) -> None:
        """Insert or replace one operator's row (``result``: :meth:`OpResult.to_dict`'s keys)."""
        values = (sweep_key, result["op"], result["verdict"],
                  None if result.get("passed") is None else int(bool(result["passed"])), result.get("pass_rate"),
                  result.get("reason"), to_json(result.get("worst")), result.get("repro"),
                  int(bool(result.get("repro_verified"))), to_json(result.get("counts")), result.get("seconds"),
                  utc_now())

        def do(c: Connection) -> None:
            self.core.execute(c, "DELETE FROM op_sweep_results WHERE sweep_key = ? AND op = ?",
                              (sweep_key, result["op"]))
            self.core.execute(c, "INSERT INTO op_sweep_results (sweep_key, op, verdict, passed, pass_rate, reason,"
                                 " worst, repro, repro_verified, counts, seconds, created_at)"
                                 " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", values)

        self.core.run_in_transaction(do, f"record operator {result['op']} of op sweep {sweep_key}")

    def results(self, sweep_key: str) -> list[JsonObject]:
        """Every operator row of a sweep, by operator name."""
        rows = self.core.read(
            lambda c: self.core.execute(c, "SELECT * FROM op_sweep_results WHERE sweep_key = ? ORDER BY op",
                                        (sweep_key,)).fetchall(), f"read op sweep {sweep_key}")
        return [_row(r) for r in rows]

    def done_ops(self, sweep_key: str) -> set[str]:
        """The operators a sweep already has a row for (skipped when it resumes)."""
        rows = self.core.read(
            lambda c: self.core.execute(c, "SELECT op FROM op_sweep_results WHERE sweep_key = ?",
                                        (sweep_key,)).fetchall(), f"read op sweep {sweep_key}")
        return {str(r[0]) for r in rows}

    def get(self, sweep_key: str) -> JsonObject | None:
        """A sweep's own row (settings decoded), or None."""
        row = self.core.read(
            lambda c: self.core.execute(c, "SELECT * FROM op_sweeps WHERE sweep_key = ?", (sweep_key,)).fetchone(),
            f"read op sweep {sweep_key}")
        return None if row is None else _row(row)

    def list(self) -> list[JsonObject]:
        """Every sweep, newest first, with its operator counts by verdict (``verdicts``)."""
        def rd(c: Connection) -> tuple[list[Row], list[Row]]:
            sweeps = self.core.execute(c, "SELECT * FROM op_sweeps ORDER BY updated_at DESC").fetchall()
            counts = self.core.execute(c, "SELECT sweep_key, verdict, COUNT(*) FROM op_sweep_results"
                                          " GROUP BY sweep_key, verdict").fetchall()
            return sweeps, counts

        sweeps, counts = self.core.read(rd, "list op sweeps")
        by_key: dict[str, dict[str, int]] = {}
        for key, verdict, n in counts:
            by_key.setdefault(str(key), {})[str(verdict)] = int(n)
        return [{**_row(s), "verdicts": by_key.get(str(s["sweep_key"]), {})} for s in sweeps]

    def delete(self, sweep_key: str) -> bool:
        """Forget a sweep and its rows; True when it was there."""
        def do(c: Connection) -> int:
            self.core.execute(c, "DELETE FROM op_sweep_results WHERE sweep_key = ?", (sweep_key,))
            return int(self.core.execute(c, "DELETE FROM op_sweeps WHERE sweep_key = ?", (sweep_key,)).rowcount)

        return bool(self.core.run_in_transaction(do, f"delete op sweep {sweep_key}"))
