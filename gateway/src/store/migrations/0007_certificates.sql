-- Enclave authority: each credential carries the certificate the enclave issued for it (an HSM
-- MAC over organization, user, type, public key, expiry and issuing activity). The enclave uses
-- key material only for requests stamped by a credential whose certificate verifies; a row
-- without one (empty) can still read, but never sign, export, create or certify.
ALTER TABLE api_keys ADD COLUMN certificate BLOB NOT NULL DEFAULT x'';
ALTER TABLE authenticators ADD COLUMN certificate BLOB NOT NULL DEFAULT x'';
