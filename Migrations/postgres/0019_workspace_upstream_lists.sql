-- A workspace may have several upstreams, tried in order (failover). The row in
-- workspace_upstream_keys stays the workspace's own upstream (the one set without --upstream,
-- listed as `default`); each labelled one is a row here with its priority (lowest tried first),
-- its kind, its sealed credentials (bound to the workspace, the label and the settings) and its
-- settings. `workspaces.upstreams_version` changes with every change to the list, and the token
-- check reads it, so every attestd reads a changed list on the next request.
-- A kind of its own, `compatible`, serves the Messages API as the Anthropic API, Microsoft
-- Foundry, Claude Platform on AWS and Bedrock's Messages API take it (base URL, auth mode, static
-- headers, model map).
ALTER TABLE workspace_upstream_keys DROP CONSTRAINT workspace_upstream_keys_kind_check;
ALTER TABLE workspace_upstream_keys ADD CONSTRAINT workspace_upstream_keys_kind_check
    CHECK (kind IN ('anthropic', 'bedrock', 'vertex', 'compatible'));
ALTER TABLE workspace_upstream_keys ADD COLUMN priority bigint NOT NULL DEFAULT 0;

CREATE TABLE workspace_upstreams (
    workspace_id bigint NOT NULL REFERENCES workspaces(id),
    label        text NOT NULL CHECK (length(label) BETWEEN 1 AND 32),
    priority     bigint NOT NULL DEFAULT 0,
    sealed_key   bytea NOT NULL,
    last4        text NOT NULL CHECK (length(last4) <= 4),
    set_at       double precision NOT NULL,
    set_by       text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('anthropic', 'bedrock', 'vertex', 'compatible')),
    settings     text CHECK ((settings IS NULL) = (kind = 'anthropic')),
    PRIMARY KEY (workspace_id, label)
);
ALTER TABLE workspaces ADD COLUMN upstreams_version bigint NOT NULL DEFAULT 0;
