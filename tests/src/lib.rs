//! Test harness: a fresh SoftHSM token, the real binaries, and the official client.
