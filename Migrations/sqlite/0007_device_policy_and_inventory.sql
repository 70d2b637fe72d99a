-- Which builds an integration admits (iOS 27 and macOS 27 say where a build came from and its
-- version), and what each device said when it registered and when it last refreshed. On the
-- integration row, like the usage policy: a change applies on the next exchange of every instance.
ALTER TABLE integrations ADD COLUMN distribution_production TEXT NOT NULL DEFAULT 'app-store,testflight';
ALTER TABLE integrations ADD COLUMN distribution_development TEXT NOT NULL DEFAULT 'development';
ALTER TABLE integrations ADD COLUMN min_bundle_version TEXT;                 -- NULL: any version
ALTER TABLE integrations ADD COLUMN require_extensions INTEGER NOT NULL DEFAULT 0 CHECK (require_extensions IN (0, 1));
ALTER TABLE integrations ADD COLUMN platforms TEXT NOT NULL DEFAULT 'ios,macos';
-- NULL for devices registered before this migration, or (category, bundle version) that wrote none.
ALTER TABLE devices ADD COLUMN platform TEXT CHECK (platform IN ('ios', 'macos'));
ALTER TABLE devices ADD COLUMN validation_category INTEGER CHECK (validation_category BETWEEN 0 AND 4294967295);
ALTER TABLE devices ADD COLUMN bundle_version TEXT;
ALTER TABLE devices ADD COLUMN os_version TEXT;
ALTER TABLE devices ADD COLUMN last_refresh_at REAL;
