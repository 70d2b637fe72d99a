-- A workspace may have several upstreams, tried in order (failover). The row in
-- workspace_upstream_keys stays the workspace's own upstream (the one set without --upstream,
-- listed as `default`); each labelled one is a row here with its priority (lowest tried first),
-- its kind, its sealed credentials (bound to the workspace, the label and the settings) and its
-- settings. `workspaces.upstreams_version` changes with every change to the list, and the token
-- check reads it, so every attestd reads a changed list on the next request.
-- A kind of its own, `compatible`, serves the Messages API as the Anthropic API, Microsoft
-- Foundry, Claude Platform on AWS and Bedrock's Messages API take it (base URL, auth mode, static
-- headers, model map): the CHECK widens, which SQLite does by building the table anew.
CREATE TABLE workspace_upstream_keys_new (
    workspace_id INTEGER PRIMARY KEY REFERENCES workspaces(id),
    sealed_key   BLOB NOT NULL,
    last4        TEXT NOT NULL CHECK (length(last4) <= 4),
    set_at       REAL NOT NULL,
    set_by       TEXT NOT NULL,
    kind         TEXT NOT NULL DEFAULT 'anthropic' CHECK (kind IN ('anthropic', 'bedrock', 'vertex', 'compatible')),
    settings     TEXT CHECK ((settings IS NULL) = (kind = 'anthropic')),
    priority     INTEGER NOT NULL DEFAULT 0
);
INSERT INTO workspace_upstream_keys_new (workspace_id, sealed_key, last4, set_at, set_by, kind, settings)
    SELECT workspace_id, sealed_key, last4, set_at, set_by, kind, settings FROM workspace_upstream_keys;
DROP TABLE workspace_upstream_keys;
ALTER TABLE workspace_upstream_keys_new RENAME TO workspace_upstream_keys;

CREATE TABLE workspace_upstreams (
    workspace_id INTEGER NOT NULL REFERENCES workspaces(id),
    label        TEXT NOT NULL CHECK (length(label) BETWEEN 1 AND 32),
    priority     INTEGER NOT NULL DEFAULT 0,
    sealed_key   BLOB NOT NULL,
    last4        TEXT NOT NULL CHECK (length(last4) <= 4),
    set_at       REAL NOT NULL,
    set_by       TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('anthropic', 'bedrock', 'vertex', 'compatible')),
    settings     TEXT CHECK ((settings IS NULL) = (kind = 'anthropic')),
    PRIMARY KEY (workspace_id, label)
);
ALTER TABLE workspaces ADD COLUMN upstreams_version INTEGER NOT NULL DEFAULT 0;
