#!/usr/bin/env python3
"""Which B-trees a SQLite store's commits write, from copies of its WAL taken while it runs.

A WAL frame is one page written by one commit, so the frames per commit of each table and
index are what that store's writes cost in pages (each frame is 4 KiB written, checksummed and
later checkpointed). Take the copies with a loop such as

    while sleep 0.25; do cp "$DB-wal" "snaps/$((i++))-wal"; done

during the window of interest, and a copy of the database and its WAL at the end (the page
numbers of each B-tree are read from that copy with SQLite's `dbstat`). Copies of one WAL
generation (the same salts) are counted once, from the longest; frames written between two
copies of a generation that was reset in between are not seen, so the counts are a sample.

Usage: bench/wal_frames.py DB_COPY SNAPSHOT...   (DB_COPY-wal beside DB_COPY)
"""
import collections
import os
import shutil
import sqlite3
import struct
import sys
import tempfile


def frames(path):
    """(page number, commit size) of each valid frame of a WAL file, and its salts."""
    data = open(path, "rb").read()
    if len(data) < 32:
        return None, []
    _magic, _version, page_size, _seq, salt1, salt2, _c1, _c2 = struct.unpack(">8I", data[:32])
    out, off = [], 32
    while off + 24 + page_size <= len(data):
        page, commit, s1, s2 = struct.unpack(">4I", data[off:off + 16])
        if (s1, s2) != (salt1, salt2):
            break
        out.append((page, commit))
        off += 24 + page_size
    return (salt1, salt2), out


def page_owners(db):
    """Page number → the table or index it belongs to."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "db")
        shutil.copy(db, copy)
        if os.path.exists(db + "-wal"):
            shutil.copy(db + "-wal", copy + "-wal")
        conn = sqlite3.connect(copy)
        owners = {pageno: name for name, pageno in conn.execute("SELECT name, pageno FROM dbstat")}
        conn.close()
    return owners


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    owners = page_owners(sys.argv[1])
    generations = {}
    for snap in sys.argv[2:]:
        salts, fs = frames(snap)
        if salts is not None and len(fs) > len(generations.get(salts, [])):
            generations[salts] = fs
    per_tree, commits, total = collections.Counter(), 0, 0
    for fs in generations.values():
        for page, commit in fs:
            per_tree[owners.get(page, "(a page added later)")] += 1
            total += 1
            commits += commit != 0
    commits = max(commits, 1)
    print(f"{len(generations)} WAL generations, {total} frames, {commits} commits, {total / commits:.1f} frames/commit")
    for name, n in per_tree.most_common():
        print(f"  {name:40s} {n:7d} {n / commits:6.2f}/commit")


if __name__ == "__main__":
    main()
