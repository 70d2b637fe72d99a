-- Each workspace's own key for the upstream Messages API (usage is billed to the workspace).
-- Only the AES-256-GCM sealed value is stored, bound to its workspace by the associated data;
-- last4 lets operators tell keys apart without revealing them.
CREATE TABLE workspace_upstream_keys (
    workspace_id INTEGER PRIMARY KEY REFERENCES workspaces(id),
    sealed_key   BLOB NOT NULL,
    last4        TEXT NOT NULL CHECK (length(last4) <= 4),
    set_at       REAL NOT NULL,
    set_by       TEXT NOT NULL
);
