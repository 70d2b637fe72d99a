-- Every exchange finds its device by key, in the read and again in the counter's update. devices
-- is WITHOUT ROWID, so each row is a key of the table's b-tree, and SQLite compares a key that
-- spills into overflow pages by reading all of it: with the receipt (about 3 KB) and the
-- credential certificate in it, every comparison of the search read the row's overflow pages,
-- from the file after each commit (a reader's page cache starts empty then), and the update read
-- them once more to rebuild the row. They move to a table of their own, which only a
-- registration and the receipt refresh read or write; a device row now fits in its leaf page.
CREATE TABLE device_receipts (
    key_id                 BLOB PRIMARY KEY REFERENCES devices(key_id),
    receipt                BLOB NOT NULL,
    credential_certificate BLOB
);
INSERT INTO device_receipts (key_id, receipt, credential_certificate)
SELECT key_id, receipt, credential_certificate FROM devices;
ALTER TABLE devices DROP COLUMN receipt;
ALTER TABLE devices DROP COLUMN credential_certificate;
