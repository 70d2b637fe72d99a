-- Device refusals are counted, not journaled one row each: a refusal row stands for every refusal
-- of its (action, client ID, reason) in one minute (`minute` = Unix time / 60), and `count` says how
-- many. Rows of their own (state changes, operators' actions) keep minute NULL and count 1.
ALTER TABLE audit_log ADD COLUMN count INTEGER NOT NULL DEFAULT 1;
ALTER TABLE audit_log ADD COLUMN minute INTEGER;
CREATE UNIQUE INDEX audit_log_refusal_minute ON audit_log (action, client_id, reason, minute) WHERE minute IS NOT NULL;
-- The retention purge deletes the oldest rows by time, in bounded batches.
CREATE INDEX audit_log_at ON audit_log (at);
-- The console's Overview reads an integration's created and revoked events by index.
CREATE INDEX audit_log_client_action ON audit_log (client_id, action, id);
