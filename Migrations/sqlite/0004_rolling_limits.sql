-- Rate limits counted in the database, so several instances share them (rolling windows):
-- mints per device from the tokens themselves, registrations per integration from the devices,
-- and challenge requests per caller in a table of their own (purged after the window).
-- Registrations do not count as mints: each token records the grant that made it.
ALTER TABLE tokens ADD COLUMN grant_type TEXT NOT NULL DEFAULT 'assertion' CHECK (grant_type IN ('registration', 'assertion'));
DROP INDEX tokens_live_by_device;
CREATE INDEX tokens_by_device ON tokens (key_id, client_id, issued_at);
CREATE INDEX devices_client_registered ON devices (client_id, registered_at);
CREATE TABLE challenge_requests (
    caller TEXT NOT NULL,
    at     REAL NOT NULL
);
CREATE INDEX challenge_requests_caller ON challenge_requests (caller, at);
