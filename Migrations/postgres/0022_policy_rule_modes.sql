-- Every rule of an integration's policy can watch before it refuses: the rules named here
-- (comma-separated, as their `integrations update` flags without the dashes) are monitored, every
-- other rule is enforced. Read with the policy by the token check and the device exchange.
ALTER TABLE integrations ADD COLUMN monitored_rules text NOT NULL DEFAULT '';
-- What each rule refused (enforced) and would have refused (monitored), per integration and UTC
-- day (`day`: Unix time of its midnight), written with the usage ledger's flush.
CREATE TABLE policy_rule_days (
    client_id    text NOT NULL REFERENCES integrations(client_id),
    rule         text NOT NULL,
    day          bigint NOT NULL,
    refused      bigint NOT NULL DEFAULT 0,
    would_refuse bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, rule, day)
);
