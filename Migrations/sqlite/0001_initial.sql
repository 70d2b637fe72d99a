-- The organisation, integrations, devices, challenges, tokens and the audit trail.
-- Times are Unix seconds (REAL). Secrets are never stored: tokens are kept as SHA-256 hashes.

CREATE TABLE workspaces (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  REAL NOT NULL
);

-- A `default` workspace always exists.
INSERT INTO workspaces (name, created_at) VALUES ('default', unixepoch());

CREATE TABLE members (
    workspace_id INTEGER NOT NULL REFERENCES workspaces(id),
    email        TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('primary_owner', 'owner', 'admin', 'developer', 'user')),
    created_at   REAL NOT NULL,
    PRIMARY KEY (workspace_id, email)
);
CREATE UNIQUE INDEX members_one_primary_owner ON members (workspace_id) WHERE role = 'primary_owner';

-- Rows are never deleted, so a client ID is never reused.
CREATE TABLE integrations (
    client_id    TEXT PRIMARY KEY,
    workspace_id INTEGER NOT NULL REFERENCES workspaces(id),
    name         TEXT NOT NULL,
    team_id      TEXT NOT NULL CHECK (length(team_id) = 10),
    environments TEXT NOT NULL,
    created_at   REAL NOT NULL,
    revoked_at   REAL
);

CREATE TABLE integration_bundle_ids (
    client_id  TEXT NOT NULL REFERENCES integrations(client_id),
    position   INTEGER NOT NULL,
    bundle_id  TEXT NOT NULL CHECK (length(bundle_id) BETWEEN 1 AND 155),
    PRIMARY KEY (client_id, bundle_id)
);

-- A key ID is attested once, for one integration.
CREATE TABLE devices (
    key_id        BLOB PRIMARY KEY CHECK (length(key_id) = 32),
    client_id     TEXT NOT NULL REFERENCES integrations(client_id),
    public_key    BLOB NOT NULL,
    sign_counter  INTEGER NOT NULL CHECK (sign_counter >= 0),
    environment   TEXT NOT NULL CHECK (environment IN ('development', 'production')),
    app_id        TEXT NOT NULL,
    receipt       BLOB NOT NULL,
    registered_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX devices_client ON devices (client_id);

-- The current challenge of each (client ID, key ID): single use, expiring.
CREATE TABLE challenges (
    client_id   TEXT NOT NULL,
    key_id      BLOB NOT NULL,
    challenge   BLOB NOT NULL,
    expires_at  REAL NOT NULL,
    used        INTEGER NOT NULL DEFAULT 0 CHECK (used IN (0, 1)),
    PRIMARY KEY (client_id, key_id)
) WITHOUT ROWID;

CREATE TABLE tokens (
    token_hash   BLOB PRIMARY KEY CHECK (length(token_hash) = 32),
    client_id    TEXT NOT NULL REFERENCES integrations(client_id),
    workspace_id INTEGER NOT NULL REFERENCES workspaces(id),
    key_id       BLOB NOT NULL,
    issued_at    REAL NOT NULL,
    expires_at   REAL NOT NULL,
    revoked_at   REAL
) WITHOUT ROWID;
CREATE INDEX tokens_client_expiry ON tokens (client_id, expires_at);

CREATE TABLE audit_log (
    id         INTEGER PRIMARY KEY,
    at         REAL NOT NULL,
    actor      TEXT,
    action     TEXT NOT NULL,
    client_id  TEXT,
    key_id     BLOB,
    reason     TEXT,
    detail     TEXT
);
CREATE INDEX audit_log_client ON audit_log (client_id, at);
