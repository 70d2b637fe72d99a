-- Every rule of an integration's policy can watch before it refuses: the rules named here
-- (comma-separated, as their `integrations update` flags without the dashes) are monitored, every
-- other rule is enforced. Read with the policy by the token check and the device exchange.
ALTER TABLE integrations ADD COLUMN monitored_rules TEXT NOT NULL DEFAULT '';
-- What each rule refused (enforced) and would have refused (monitored), per integration and UTC
-- day (`day`: Unix time of its midnight), written with the usage ledger's flush.
CREATE TABLE policy_rule_days (
    client_id    TEXT NOT NULL REFERENCES integrations(client_id),
    rule         TEXT NOT NULL,
    day          INTEGER NOT NULL,
    refused      INTEGER NOT NULL DEFAULT 0,
    would_refuse INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, rule, day)
);
