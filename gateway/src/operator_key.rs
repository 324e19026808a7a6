//! The operator's key, for the operator calls the gateway's commands make to the enclave
//! (`init-org`, `init-dev`): read from a file (`operator_key_file`, `COFFER_OPERATOR_KEY_FILE`),
//! never from argv, never logged or printed. `serve` never reads it: the file belongs to the
//! operator's account, not the gateway service's (deploy/README.md).

use std::path::Path;

use zeroize::Zeroizing;

/// An operator's P-256 private key. Zeroized on drop (`p256`'s signing key), not `Clone`, and
/// printed as `OperatorKey(<public key>)` only.
pub struct OperatorKey(p256::ecdsa::SigningKey);

impl std::fmt::Debug for OperatorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OperatorKey({})", self.public_key())
    }
}

impl OperatorKey {
    /// A fresh key from the OS's randomness.
    pub fn generate() -> Self {
        Self(p256::ecdsa::SigningKey::random(&mut rand_core::OsRng))
    }

    /// Reads the key file: the 32-byte scalar as hex on its first line (what
    /// `coffer-gateway operator-keygen` writes). Every copy of the text is zeroized.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = Zeroizing::new(
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading the operator key file {}: {e}", path.display()))?,
        );
        let line = text.lines().next().unwrap_or_default().trim();
        let bytes = Zeroizing::new(hex::decode(line).map_err(|_| {
            anyhow::anyhow!("the operator key file {} does not hold a hex P-256 private key", path.display())
        })?);
        let key = p256::ecdsa::SigningKey::from_slice(&bytes).map_err(|_| {
            anyhow::anyhow!("the operator key file {} does not hold a P-256 private key", path.display())
        })?;
        Ok(Self(key))
    }

    /// Writes a fresh key to `path` (created, mode 0600; an existing file is never overwritten)
    /// and returns it.
    pub fn create_file(path: &Path) -> anyhow::Result<Self> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let key = Self::generate();
        let text = Zeroizing::new(format!("{}\n", hex::encode(key.0.to_bytes())));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| anyhow::anyhow!("creating the operator key file {}: {e}", path.display()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        Ok(key)
    }

    /// The public key as the enclave's `operator_public_keys` lists it (compressed, hex).
    pub fn public_key(&self) -> String {
        coffer_auth::operator::public_key_hex(&self.0)
    }

    /// The `X-Stamp` of `body` by this key.
    pub fn stamp(&self, body: &[u8]) -> String {
        coffer_auth::operator::stamp(&self.0, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_round_trips_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("coffer-operator-key-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("operator.key");
        let made = OperatorKey::create_file(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(OperatorKey::create_file(&path).is_err(), "never overwritten");
        let read = OperatorKey::from_file(&path).unwrap();
        assert_eq!(read.public_key(), made.public_key());
        assert_eq!(format!("{read:?}"), format!("OperatorKey({})", made.public_key()), "no private half printed");
        std::fs::write(&path, "not hex").unwrap();
        assert!(OperatorKey::from_file(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
