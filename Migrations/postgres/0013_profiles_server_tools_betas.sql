-- What the published client 0.2 sends and the API bills beyond tokens: user profiles, server
-- tools and betas become policy, and the ledger keeps a row per user profile (`profile`, '' for
-- requests without one) and every `usage.server_tool_use` counter by its own name.
ALTER TABLE integrations ADD COLUMN allowed_server_tools text;              -- comma-separated names ('' none); NULL: any
ALTER TABLE integrations ADD COLUMN max_server_tool_uses bigint NOT NULL DEFAULT 0 CHECK (max_server_tool_uses >= 0);
ALTER TABLE integrations ADD COLUMN allowed_betas text;                     -- newline-separated names; NULL: any
ALTER TABLE integrations ADD COLUMN profile_requests_per_minute bigint NOT NULL DEFAULT 0 CHECK (profile_requests_per_minute >= 0);
ALTER TABLE integrations ADD COLUMN profile_monthly_token_budget bigint NOT NULL DEFAULT 0 CHECK (profile_monthly_token_budget >= 0);
-- The ledger's key gains the profile.
ALTER TABLE usage_hourly ADD COLUMN profile text NOT NULL DEFAULT '';
ALTER TABLE usage_hourly DROP CONSTRAINT usage_hourly_pkey, ADD PRIMARY KEY (client_id, model, hour, profile);
ALTER TABLE usage_errors ADD COLUMN profile text NOT NULL DEFAULT '';
ALTER TABLE usage_errors DROP CONSTRAINT usage_errors_pkey, ADD PRIMARY KEY (client_id, model, hour, profile, status);
ALTER TABLE usage_refusals ADD COLUMN profile text NOT NULL DEFAULT '';
ALTER TABLE usage_refusals DROP CONSTRAINT usage_refusals_pkey, ADD PRIMARY KEY (client_id, model, hour, profile, reason);
-- `usage.server_tool_use` counters (web_search_requests, …) as the upstream reported them.
CREATE TABLE usage_server_tools (
    client_id text NOT NULL REFERENCES integrations(client_id),
    model     text NOT NULL,
    hour      bigint NOT NULL,
    profile   text NOT NULL DEFAULT '',
    name      text NOT NULL,
    count     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, model, hour, profile, name)
);
-- Tokens per user profile and month, for the profile budget (written only for replies that spent
-- tokens, so only profiles the upstream accepted).
CREATE TABLE usage_profile_monthly (
    client_id text NOT NULL REFERENCES integrations(client_id),
    profile   text NOT NULL,
    month     bigint NOT NULL,
    tokens    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, profile, month)
);
-- Relayed requests per user profile and minute, purged after two minutes like the device minutes.
CREATE TABLE profile_request_minutes (
    client_id text NOT NULL,
    profile   text NOT NULL,
    minute    bigint NOT NULL,
    requests  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, profile, minute)
);
CREATE INDEX profile_request_minutes_minute ON profile_request_minutes (minute);
