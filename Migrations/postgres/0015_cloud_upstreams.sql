-- A workspace's upstream may be Amazon Bedrock or Google Vertex AI instead of the Anthropic API:
-- still one row per workspace, so setting one kind replaces the other. For a cloud kind
-- sealed_key holds its credentials (sealed like a key) and settings the rest, as JSON in the
-- clear (region, project, endpoint, model mapping); the Anthropic API has no settings.
ALTER TABLE workspace_upstream_keys ADD COLUMN kind text NOT NULL DEFAULT 'anthropic' CHECK (kind IN ('anthropic', 'bedrock', 'vertex'));
ALTER TABLE workspace_upstream_keys ADD COLUMN settings text;
ALTER TABLE workspace_upstream_keys ADD CONSTRAINT workspace_upstream_keys_settings CHECK ((settings IS NULL) = (kind = 'anthropic'));
