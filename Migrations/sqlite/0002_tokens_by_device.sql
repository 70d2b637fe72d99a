-- A device keeps at most its two newest live tokens (the current one and the one before it, for
-- requests already in flight): minting revokes older ones, found through this index.
CREATE INDEX tokens_live_by_device ON tokens (key_id, client_id, issued_at) WHERE revoked_at IS NULL;
