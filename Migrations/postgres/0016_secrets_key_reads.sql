-- What each attestd last read from its secrets key files: a row per host and key file (a restart
-- updates its row), written by the instance at start, when what it holds changes, and every five
-- minutes; read by `attestctl secrets status` and `finish-rotation` (which hosts still hold the
-- previous key). Key IDs as operators see them (16 hex digits), never a key.
CREATE TABLE secrets_key_reads (
    host         text NOT NULL,
    key_file     text NOT NULL,
    current_key  text,
    previous_key text,
    read_at      double precision,
    reported_at  double precision NOT NULL,
    pid          bigint NOT NULL,
    -- Why the files on disk were refused at its last look (it kept the keys it held), or NULL.
    problem      text,
    PRIMARY KEY (host, key_file)
);
