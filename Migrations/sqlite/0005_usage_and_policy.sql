-- What each integration may spend, and what it spent. The policy lives on the integration row,
-- so the token check reads it in the query it already makes: an update applies on the next
-- request of every instance. Usage arrives in aggregated batches (one transaction a flush).
ALTER TABLE integrations ADD COLUMN allowed_models TEXT;                     -- newline-separated IDs; NULL: any model
ALTER TABLE integrations ADD COLUMN max_tokens INTEGER NOT NULL DEFAULT 0 CHECK (max_tokens >= 0);
ALTER TABLE integrations ADD COLUMN device_requests_per_minute INTEGER NOT NULL DEFAULT 60 CHECK (device_requests_per_minute >= 0);
ALTER TABLE integrations ADD COLUMN monthly_token_budget INTEGER NOT NULL DEFAULT 0 CHECK (monthly_token_budget >= 0);
-- Relayed requests per integration, model and hour (`hour`: Unix time of the hour's start).
CREATE TABLE usage_hourly (
    client_id                   TEXT NOT NULL REFERENCES integrations(client_id),
    model                       TEXT NOT NULL,
    hour                        INTEGER NOT NULL,
    requests                    INTEGER NOT NULL DEFAULT 0,
    input_tokens                INTEGER NOT NULL DEFAULT 0,
    output_tokens               INTEGER NOT NULL DEFAULT 0,
    cache_creation_input_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_input_tokens     INTEGER NOT NULL DEFAULT 0,
    incomplete                  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, model, hour)
);
CREATE INDEX usage_hourly_hour ON usage_hourly (hour);
-- Answers of upstream status >= 400 (and 502/504 when it could not be reached), by status.
CREATE TABLE usage_errors (
    client_id TEXT NOT NULL REFERENCES integrations(client_id),
    model     TEXT NOT NULL,
    hour      INTEGER NOT NULL,
    status    INTEGER NOT NULL,
    count     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, model, hour, status)
);
-- Requests the policy refused (never sent upstream), by reason.
CREATE TABLE usage_refusals (
    client_id TEXT NOT NULL REFERENCES integrations(client_id),
    model     TEXT NOT NULL,
    hour      INTEGER NOT NULL,
    reason    TEXT NOT NULL,
    count     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, model, hour, reason)
);
-- Input plus output tokens per integration and calendar month (UTC, `month` = YYYYMM): the budget
-- check reads one row by key instead of summing the hours.
CREATE TABLE usage_monthly (
    client_id TEXT NOT NULL REFERENCES integrations(client_id),
    month     INTEGER NOT NULL,
    tokens    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, month)
);
-- Relayed requests per device key and minute (`minute` = Unix time / 60), so every instance sees
-- the others' requests in the per-device limit; rows older than two minutes are purged.
CREATE TABLE device_request_minutes (
    key_id    BLOB NOT NULL,
    client_id TEXT NOT NULL,
    minute    INTEGER NOT NULL,
    requests  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, client_id, minute)
);
-- The flush forgets minutes older than two every second: by minute, not by a scan.
CREATE INDEX device_request_minutes_minute ON device_request_minutes (minute);
