-- Every token exchange reads a device's counter, platform and versions and writes its counter and
-- last_refresh_at. Columns added by ALTER TABLE sit after the receipt (about 3 KB), so those were
-- stored in the row's overflow page: each exchange read it and wrote it again. The table is
-- rebuilt with the small columns first and the receipt and credential certificate last, so an
-- exchange touches the row's leaf page only. Same columns, constraints and indexes.
CREATE TABLE devices_reordered (
    key_id                 BLOB PRIMARY KEY CHECK (length(key_id) = 32),
    client_id              TEXT NOT NULL REFERENCES integrations(client_id),
    public_key             BLOB NOT NULL,
    sign_counter           INTEGER NOT NULL CHECK (sign_counter >= 0),
    environment            TEXT NOT NULL CHECK (environment IN ('development', 'production')),
    app_id                 TEXT NOT NULL,
    registered_at          REAL NOT NULL,
    platform               TEXT CHECK (platform IN ('ios', 'macos')),
    validation_category    INTEGER CHECK (validation_category BETWEEN 0 AND 4294967295),
    bundle_version         TEXT,
    os_version             TEXT,
    last_refresh_at        REAL,
    receipt_created_at     REAL,
    receipt_not_before     REAL,
    receipt_expires_at     REAL,
    risk_metric            INTEGER CHECK (risk_metric >= 0),
    risk_checked_at        REAL,
    risk_refresh_due_at    REAL,      -- NULL: never (no receipt, or expired)
    risk_claimed_until     REAL,
    risk_claim             TEXT,      -- the claiming batch's random ID
    risk_over_limit_at     REAL,      -- when its metric was first seen above the limit
    receipt                BLOB NOT NULL,
    credential_certificate BLOB
) WITHOUT ROWID;
INSERT INTO devices_reordered (key_id, client_id, public_key, sign_counter, environment, app_id, registered_at, platform,
                               validation_category, bundle_version, os_version, last_refresh_at, receipt_created_at,
                               receipt_not_before, receipt_expires_at, risk_metric, risk_checked_at, risk_refresh_due_at,
                               risk_claimed_until, risk_claim, risk_over_limit_at, receipt, credential_certificate)
SELECT key_id, client_id, public_key, sign_counter, environment, app_id, registered_at, platform,
       validation_category, bundle_version, os_version, last_refresh_at, receipt_created_at,
       receipt_not_before, receipt_expires_at, risk_metric, risk_checked_at, risk_refresh_due_at,
       risk_claimed_until, risk_claim, risk_over_limit_at, receipt, credential_certificate
FROM devices;
DROP TABLE devices;
ALTER TABLE devices_reordered RENAME TO devices;
CREATE INDEX devices_client ON devices (client_id);
CREATE INDEX devices_client_registered ON devices (client_id, registered_at);
CREATE INDEX devices_risk_due ON devices (risk_refresh_due_at) WHERE risk_refresh_due_at IS NOT NULL;
