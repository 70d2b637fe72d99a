-- Alerts before the money runs out. A webhook endpoint of a workspace: where budget events go,
-- which events, at which thresholds (percent of a budget), and its signing secret sealed under
-- the secrets key (shown once, when it is added).
CREATE TABLE webhook_endpoints (
    id            INTEGER PRIMARY KEY,
    workspace_id  INTEGER NOT NULL REFERENCES workspaces(id),
    url           TEXT NOT NULL,
    events        TEXT NOT NULL,   -- comma-separated: budget.threshold
    thresholds    TEXT NOT NULL,   -- comma-separated percents: 50,80,100
    sealed_secret BLOB NOT NULL,
    created_at    REAL NOT NULL,
    created_by    TEXT NOT NULL,
    removed_at    REAL
);
CREATE INDEX webhook_endpoints_workspace ON webhook_endpoints (workspace_id) WHERE removed_at IS NULL;
-- Each threshold of each budget fires once per period: the first instance to insert the row
-- writes the deliveries in the same transaction; another instance's insert does nothing.
-- `budget` names it: scope, period and whose (workspace ID, client ID, profile).
CREATE TABLE budget_thresholds_fired (
    budget     TEXT NOT NULL,
    period_key INTEGER NOT NULL,
    threshold  INTEGER NOT NULL,
    fired_at   REAL NOT NULL,
    PRIMARY KEY (budget, period_key, threshold)
);
-- The durable outbox: one row per delivery (its ID is the idempotency ID the receiver sees),
-- claimed with a lease so that two instances or a restart neither lose nor duplicate one.
CREATE TABLE webhook_outbox (
    id              TEXT PRIMARY KEY,
    endpoint_id     INTEGER NOT NULL REFERENCES webhook_endpoints(id),
    event           TEXT NOT NULL,
    body            TEXT NOT NULL,
    created_at      REAL NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    lease_owner     TEXT,
    lease_until     REAL,
    delivered_at    REAL,
    failed_at       REAL,            -- given up on after the last attempt
    last_attempt_at REAL,
    last_status     INTEGER,         -- the receiver's HTTP status (NULL: no answer)
    last_error      TEXT
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (next_attempt_at) WHERE delivered_at IS NULL AND failed_at IS NULL;
CREATE INDEX webhook_outbox_endpoint ON webhook_outbox (endpoint_id, created_at);
