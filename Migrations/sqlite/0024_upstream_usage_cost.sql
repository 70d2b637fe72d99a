-- Money beside tokens in the ledger by upstream (`attestctl usage --by upstream`): each row's cost
-- in micro-dollars, priced when recorded as usage_hourly's is (rows from before stay at 0).
ALTER TABLE usage_hourly_by_upstream ADD COLUMN cost_micro_usd INTEGER NOT NULL DEFAULT 0;
