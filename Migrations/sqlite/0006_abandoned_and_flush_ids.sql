-- A non-streamed reply whose client left is read to its end all the same (the upstream bills
-- it) and counted here as well as in `requests`.
ALTER TABLE usage_hourly ADD COLUMN abandoned INTEGER NOT NULL DEFAULT 0;
-- Each usage flush writes its batch ID in the same transaction: a flush retried after its commit
-- went through but its answer was lost finds its ID and adds nothing twice.
CREATE TABLE usage_flushes (
    batch_id   TEXT PRIMARY KEY,
    flushed_at REAL NOT NULL
);
CREATE INDEX usage_flushes_at ON usage_flushes (flushed_at);
