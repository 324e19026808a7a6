-- Indexes that are a prefix of another on the same table (0008, 0009 added the longer ones for
-- keyset pages): every lookup they served the longer one serves, and each cost every insert.
DROP INDEX IF EXISTS users_org;
DROP INDEX IF EXISTS activities_org;
DROP INDEX IF EXISTS records_org;
