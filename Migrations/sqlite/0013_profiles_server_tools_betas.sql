-- What the published client 0.2 sends and the API bills beyond tokens: user profiles, server
-- tools and betas become policy, and the ledger keeps a row per user profile (`profile`, '' for
-- requests without one) and every `usage.server_tool_use` counter by its own name.
ALTER TABLE integrations ADD COLUMN allowed_server_tools TEXT;              -- comma-separated names ('' none); NULL: any
ALTER TABLE integrations ADD COLUMN max_server_tool_uses INTEGER NOT NULL DEFAULT 0 CHECK (max_server_tool_uses >= 0);
ALTER TABLE integrations ADD COLUMN allowed_betas TEXT;                     -- newline-separated names; NULL: any
ALTER TABLE integrations ADD COLUMN profile_requests_per_minute INTEGER NOT NULL DEFAULT 0 CHECK (profile_requests_per_minute >= 0);
ALTER TABLE integrations ADD COLUMN profile_monthly_token_budget INTEGER NOT NULL DEFAULT 0 CHECK (profile_monthly_token_budget >= 0);
-- The ledger's key gains the profile: SQLite cannot change a primary key, so each table is rebuilt.
CREATE TABLE usage_hourly_by_profile (
    client_id                   TEXT NOT NULL REFERENCES integrations(client_id),
    model                       TEXT NOT NULL,
    hour                        INTEGER NOT NULL,
    profile                     TEXT NOT NULL DEFAULT '',
    requests                    INTEGER NOT NULL DEFAULT 0,
    input_tokens                INTEGER NOT NULL DEFAULT 0,
    output_tokens               INTEGER NOT NULL DEFAULT 0,
    cache_creation_input_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_input_tokens     INTEGER NOT NULL DEFAULT 0,
    incomplete                  INTEGER NOT NULL DEFAULT 0,
    abandoned                   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, model, hour, profile)
);
INSERT INTO usage_hourly_by_profile (client_id, model, hour, profile, requests, input_tokens, output_tokens, cache_creation_input_tokens,
                                     cache_read_input_tokens, incomplete, abandoned)
    SELECT client_id, model, hour, '', requests, input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens,
           incomplete, abandoned FROM usage_hourly;
DROP TABLE usage_hourly;
ALTER TABLE usage_hourly_by_profile RENAME TO usage_hourly;
CREATE INDEX usage_hourly_hour ON usage_hourly (hour);
CREATE TABLE usage_errors_by_profile (
    client_id TEXT NOT NULL REFERENCES integrations(client_id),
    model     TEXT NOT NULL,
    hour      INTEGER NOT NULL,
    profile   TEXT NOT NULL DEFAULT '',
    status    INTEGER NOT NULL,
    count     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, model, hour, profile, status)
);
INSERT INTO usage_errors_by_profile (client_id, model, hour, profile, status, count)
    SELECT client_id, model, hour, '', status, count FROM usage_errors;
DROP TABLE usage_errors;
ALTER TABLE usage_errors_by_profile RENAME TO usage_errors;
CREATE TABLE usage_refusals_by_profile (
    client_id TEXT NOT NULL REFERENCES integrations(client_id),
    model     TEXT NOT NULL,
    hour      INTEGER NOT NULL,
    profile   TEXT NOT NULL DEFAULT '',
    reason    TEXT NOT NULL,
    count     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, model, hour, profile, reason)
);
INSERT INTO usage_refusals_by_profile (client_id, model, hour, profile, reason, count)
    SELECT client_id, model, hour, '', reason, count FROM usage_refusals;
DROP TABLE usage_refusals;
ALTER TABLE usage_refusals_by_profile RENAME TO usage_refusals;
-- `usage.server_tool_use` counters (web_search_requests, …) as the upstream reported them.
CREATE TABLE usage_server_tools (
    client_id TEXT NOT NULL REFERENCES integrations(client_id),
    model     TEXT NOT NULL,
    hour      INTEGER NOT NULL,
    profile   TEXT NOT NULL DEFAULT '',
    name      TEXT NOT NULL,
    count     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, model, hour, profile, name)
);
-- Tokens per user profile and month, for the profile budget (written only for replies that spent
-- tokens, so only profiles the upstream accepted).
CREATE TABLE usage_profile_monthly (
    client_id TEXT NOT NULL REFERENCES integrations(client_id),
    profile   TEXT NOT NULL,
    month     INTEGER NOT NULL,
    tokens    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, profile, month)
);
-- Relayed requests per user profile and minute, purged after two minutes like the device minutes.
CREATE TABLE profile_request_minutes (
    client_id TEXT NOT NULL,
    profile   TEXT NOT NULL,
    minute    INTEGER NOT NULL,
    requests  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, profile, minute)
);
CREATE INDEX profile_request_minutes_minute ON profile_request_minutes (minute);
