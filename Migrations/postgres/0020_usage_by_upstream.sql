-- Which of a workspace's upstreams served each relayed request (its label; `default` for the
-- workspace's own upstream, the one set without --upstream): requests and tokens per
-- integration, hour and label, for `attestctl usage --by upstream`. Kept apart from usage_hourly
-- so that its key (and every report on it) stays as it is.
CREATE TABLE usage_hourly_by_upstream (
    client_id                   text NOT NULL REFERENCES integrations(client_id),
    hour                        bigint NOT NULL,
    upstream                    text NOT NULL,
    requests                    bigint NOT NULL DEFAULT 0,
    input_tokens                bigint NOT NULL DEFAULT 0,
    output_tokens               bigint NOT NULL DEFAULT 0,
    cache_creation_input_tokens bigint NOT NULL DEFAULT 0,
    cache_read_input_tokens     bigint NOT NULL DEFAULT 0,
    failovers                   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, hour, upstream)
);
CREATE INDEX usage_hourly_by_upstream_hour ON usage_hourly_by_upstream (hour);
