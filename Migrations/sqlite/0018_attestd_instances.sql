-- Where each attestd listens, written when its listeners open (a restart replaces its row): the
-- host, the public and admin listeners as they listen (the real port when 0 was asked for; no
-- admin address with --admin-listen none), its --base-url values one a line, and its version.
-- `attestctl console-login` links to the console of the most recently started instance, on its
-- own host first (its first --base-url, else its admin listener); --base-url overrides it.
CREATE TABLE attestd_instances (
    host           TEXT NOT NULL,
    public_address TEXT NOT NULL,
    admin_address  TEXT,
    base_urls      TEXT NOT NULL,
    version        TEXT NOT NULL,
    started_at     REAL NOT NULL,
    pid            INTEGER NOT NULL,
    PRIMARY KEY (host, public_address)
);
