-- The hosts a cloud upstream's credentials may be sent to, for the whole deployment
-- (`attestctl cloud-endpoints allow`): an endpoint or token URL on any other host is refused when
-- set and when used. No rows: any host the URL rules allow. `*.example.com` allows its subdomains.
CREATE TABLE cloud_endpoint_pins (
    host   text PRIMARY KEY,
    set_at double precision NOT NULL,
    set_by text NOT NULL
);
