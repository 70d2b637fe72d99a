-- Each mint revokes the device's older live tokens but the newest one before it. 0004 replaced
-- the live-token index with one over every token (for the rolling mint window), so that
-- statement read every token the device had minted since the last purge: 18 ms per mint at
-- 20,000 tokens, growing with each one. The live tokens get their own index again (at most two
-- rows per device); the full index stays for the window counts.
CREATE INDEX tokens_live_by_device ON tokens (key_id, client_id, issued_at) WHERE revoked_at IS NULL;
