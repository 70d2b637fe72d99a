-- What each attestd last read from its secrets key files: a row per host and key file (a restart
-- updates its row), written by the instance at start, when what it holds changes, and every five
-- minutes; read by `attestctl secrets status` and `finish-rotation` (which hosts still hold the
-- previous key). Key IDs as operators see them (16 hex digits), never a key.
CREATE TABLE secrets_key_reads (
    host         TEXT NOT NULL,
    key_file     TEXT NOT NULL,
    current_key  TEXT,
    previous_key TEXT,
    read_at      REAL,
    reported_at  REAL NOT NULL,
    pid          INTEGER NOT NULL,
    -- Why the files on disk were refused at its last look (it kept the keys it held), or NULL.
    problem      TEXT,
    PRIMARY KEY (host, key_file)
);
