-- Money: every ledger row's cost (micro-dollars, priced when it was recorded, never rewritten),
-- the 1-hour share of its cache writes (priced apart), budgets in money per integration, per user
-- profile within it and per workspace, the spend each budget counts, and each workspace's price
-- overrides with the time they took effect.
ALTER TABLE usage_hourly ADD COLUMN cost_micro_usd bigint NOT NULL DEFAULT 0;
ALTER TABLE usage_hourly ADD COLUMN cache_creation_1h_input_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE integrations ADD COLUMN monthly_budget_micro_usd bigint NOT NULL DEFAULT 0 CHECK (monthly_budget_micro_usd >= 0);
ALTER TABLE integrations ADD COLUMN daily_budget_micro_usd bigint NOT NULL DEFAULT 0 CHECK (daily_budget_micro_usd >= 0);
ALTER TABLE integrations ADD COLUMN profile_monthly_budget_micro_usd bigint NOT NULL DEFAULT 0 CHECK (profile_monthly_budget_micro_usd >= 0);
ALTER TABLE integrations ADD COLUMN profile_daily_budget_micro_usd bigint NOT NULL DEFAULT 0 CHECK (profile_daily_budget_micro_usd >= 0);
ALTER TABLE workspaces ADD COLUMN monthly_budget_micro_usd bigint NOT NULL DEFAULT 0 CHECK (monthly_budget_micro_usd >= 0);
ALTER TABLE workspaces ADD COLUMN daily_budget_micro_usd bigint NOT NULL DEFAULT 0 CHECK (daily_budget_micro_usd >= 0);
-- Micro-dollars per budget scope (`w:<workspace id>`, `i:<client id>`, `p:<client id>:<profile>`)
-- and period (a month as YYYYMM, or a day as Unix time / 86400): the token check reads its rows by key.
CREATE TABLE usage_spend (
    scope     text NOT NULL,
    period    bigint NOT NULL,
    micro_usd bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, period)
);
-- A workspace's price table from `effective_at` on (the whole table, as `prices show --json`
-- prints it): the newest is in force, the older ones say what priced the rows before it.
CREATE TABLE price_tables (
    workspace_id bigint NOT NULL REFERENCES workspaces(id),
    effective_at double precision NOT NULL,
    prices       text NOT NULL,
    set_by       text NOT NULL,
    PRIMARY KEY (workspace_id, effective_at)
);
