-- Apple's receipts and the fraud-risk metric they carry. Each device keeps its latest validated
-- receipt (the registration's ATTEST one, then each refreshed RECEIPT one) with its times, the
-- credential certificate every later receipt must name, and the metric Apple last returned.
-- The refresh job claims due rows with a lease (risk_claimed_until), so a killed instance's
-- claim lapses on its own and two instances never post the same device at once.
ALTER TABLE devices ADD COLUMN credential_certificate bytea;
ALTER TABLE devices ADD COLUMN receipt_created_at double precision;
ALTER TABLE devices ADD COLUMN receipt_not_before double precision;
ALTER TABLE devices ADD COLUMN receipt_expires_at double precision;
ALTER TABLE devices ADD COLUMN risk_metric bigint CHECK (risk_metric >= 0);
ALTER TABLE devices ADD COLUMN risk_checked_at double precision;
ALTER TABLE devices ADD COLUMN risk_refresh_due_at double precision;      -- NULL: never (no receipt, or expired)
ALTER TABLE devices ADD COLUMN risk_claimed_until double precision;
ALTER TABLE devices ADD COLUMN risk_claim text;                       -- the claiming batch's random ID
ALTER TABLE devices ADD COLUMN risk_over_limit_at double precision;       -- when its metric was first seen above the limit
CREATE INDEX devices_risk_due ON devices (risk_refresh_due_at) WHERE risk_refresh_due_at IS NOT NULL;
-- Per integration: refuse a device at its next token refresh once its metric is above this (0: no limit).
ALTER TABLE integrations ADD COLUMN risk_limit bigint NOT NULL DEFAULT 0 CHECK (risk_limit >= 0);
-- One App Attest data-service key per Apple team (the .p8 from the developer account), sealed
-- under the secrets key like the workspaces' upstream keys and bound to its team ID.
CREATE TABLE apple_keys (
    team_id    text PRIMARY KEY,
    key_id     text NOT NULL,
    sealed_key bytea NOT NULL,
    set_by     text NOT NULL,
    set_at     double precision NOT NULL
);
