-- Whether a user's email and phone number are those its sub-organization's sign-up gave (its
-- parent's word or a verification token's), unchanged since: the auth proxy finds a
-- sub-organization by contact only through such a user. Users created before: not verified.
ALTER TABLE users ADD COLUMN contacts_verified BIGINT NOT NULL DEFAULT 0;
