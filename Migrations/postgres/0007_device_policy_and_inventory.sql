-- Which builds an integration admits (iOS 27 and macOS 27 say where a build came from and its
-- version), and what each device said when it registered and when it last refreshed. On the
-- integration row, like the usage policy: a change applies on the next exchange of every instance.
ALTER TABLE integrations ADD COLUMN distribution_production text NOT NULL DEFAULT 'app-store,testflight';
ALTER TABLE integrations ADD COLUMN distribution_development text NOT NULL DEFAULT 'development';
ALTER TABLE integrations ADD COLUMN min_bundle_version text;                 -- NULL: any version
ALTER TABLE integrations ADD COLUMN require_extensions bigint NOT NULL DEFAULT 0 CHECK (require_extensions IN (0, 1));
ALTER TABLE integrations ADD COLUMN platforms text NOT NULL DEFAULT 'ios,macos';
-- NULL for devices registered before this migration, or (category, bundle version) that wrote none.
ALTER TABLE devices ADD COLUMN platform text CHECK (platform IN ('ios', 'macos'));
ALTER TABLE devices ADD COLUMN validation_category bigint CHECK (validation_category BETWEEN 0 AND 4294967295);
ALTER TABLE devices ADD COLUMN bundle_version text;
ALTER TABLE devices ADD COLUMN os_version text;
ALTER TABLE devices ADD COLUMN last_refresh_at double precision;
