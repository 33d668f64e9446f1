"""The generation cache of one evaluation output: sqlite, key -> completion text (stapo.eval.generation computes the
keys), committed after every chunk, so a killed evaluation resumes where it stopped. No lm-eval, no torch: ``stapo
eval``'s preflight opens it (and refuses a damaged one in one line) before anything heavy is imported."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stapo.core.atomic import refuse_links

__all__ = ["GenerationCache", "cache_path"]


def cache_path(out: Path) -> Path:
    """FILE.jsonl's cache: FILE.jsonl.cache.sqlite beside it."""
    return out.with_name(out.name + ".cache.sqlite")


class GenerationCache:
    """sqlite key -> completion text, committed after every chunk (survives a kill)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        refuse_links([path, *(path.with_name(path.name + s) for s in ("-journal", "-wal", "-shm"))])
        self.db = sqlite3.connect(str(path))
        self.db.execute("CREATE TABLE IF NOT EXISTS gen (key TEXT PRIMARY KEY, text TEXT NOT NULL)")
        self.db.commit()

    def get_many(self, keys: list[str]) -> dict[str, str]:
        found = {}
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            q = f"SELECT key, text FROM gen WHERE key IN ({','.join('?' * len(part))})"
            found.update(self.db.execute(q, part).fetchall())
        return found

    def put_many(self, items: list[tuple[str, str]]) -> None:
        self.db.executemany("INSERT OR REPLACE INTO gen VALUES (?, ?)", items)
        self.db.commit()

    def close(self) -> None:
        self.db.close()
