-- Where each attestd listens, written when its listeners open (a restart replaces its row): the
-- host, the public and admin listeners as they listen (the real port when 0 was asked for; no
-- admin address with --admin-listen none), its --base-url values one a line, and its version.
-- `attestctl console-login` links to the console of the most recently started instance, on its
-- own host first (its first --base-url, else its admin listener); --base-url overrides it.
CREATE TABLE attestd_instances (
    host           text NOT NULL,
    public_address text NOT NULL,
    admin_address  text,
    base_urls      text NOT NULL,
    version        text NOT NULL,
    started_at     double precision NOT NULL,
    pid            bigint NOT NULL,
    PRIMARY KEY (host, public_address)
);
