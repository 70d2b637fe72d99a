-- The console's sign-in links and sessions. Only SHA-256 hashes of the link and session tokens
-- are stored, so a copy of the database signs no one in. A session names its member by workspace
-- and email, and is honoured only while that membership exists.
CREATE TABLE console_sign_in_links (
    token_hash   bytea PRIMARY KEY,
    workspace_id bigint NOT NULL REFERENCES workspaces(id),
    email        text NOT NULL,
    created_at   double precision NOT NULL,
    expires_at   double precision NOT NULL,
    used_at      double precision
);

CREATE TABLE console_sessions (
    token_hash   bytea PRIMARY KEY,
    workspace_id bigint NOT NULL REFERENCES workspaces(id),
    email        text NOT NULL,
    created_at   double precision NOT NULL,
    last_seen_at double precision NOT NULL,
    -- The absolute end (created_at plus the longest a session may last).
    expires_at   double precision NOT NULL,
    ended_at     double precision
);
CREATE INDEX console_sessions_by_member ON console_sessions (workspace_id, email);
