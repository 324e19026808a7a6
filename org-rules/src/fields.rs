//! The rules of the free-form fields organization records share (names, email addresses, phone
//! numbers), one rule each for the enclave's transitions and the gateway's early answers.

/// The longest name (of a user, a wallet, an organization, a tag), in characters.
pub const MAX_NAME_CHARS: usize = 256;

/// The longest email address (RFC 5321's path limit).
pub const MAX_EMAIL_BYTES: usize = 254;

/// Why a field was refused, in words that name the field.
pub type FieldError = String;

/// A name: not blank, at most [`MAX_NAME_CHARS`] characters, no control characters (a name is
/// shown in consoles, logs and mail; a newline or an escape sequence in it would forge lines).
pub fn name(field: &str, value: &str) -> Result<(), FieldError> {
    if value.trim().is_empty() {
        return Err(format!("{field} must not be empty"));
    }
    if value.chars().count() > MAX_NAME_CHARS {
        return Err(format!("{field} must be at most {MAX_NAME_CHARS} characters"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{field} must not contain control characters"));
    }
    Ok(())
}

/// A plausible email address: one `@` after a non-empty local part, a dotted domain, no spaces
/// or control characters, at most [`MAX_EMAIL_BYTES`] bytes.
pub fn email(value: &str) -> bool {
    match value.split_once('@') {
        Some((local, domain)) => {
            !local.is_empty()
                && domain.contains('.')
                && !domain.starts_with('.')
                && !domain.ends_with('.')
                && !domain.contains('@')
                && !value.chars().any(|c| c.is_whitespace() || c.is_control())
                && value.len() <= MAX_EMAIL_BYTES
        }
        None => false,
    }
}

/// An E.164 phone number: `+` and 4 to 15 digits (the rule of
/// `coffer_auth::verification_token::is_e164`, which this crate does not depend on; the gateway's
/// tests check that the two agree).
pub fn phone(value: &str) -> bool {
    value.strip_prefix('+').is_some_and(|d| (4..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_printable() {
        assert!(name("n", "Alice").is_ok());
        assert!(name("n", &"é".repeat(MAX_NAME_CHARS)).is_ok());
        assert_eq!(name("userName", " ").unwrap_err(), "userName must not be empty");
        assert!(name("n", &"a".repeat(MAX_NAME_CHARS + 1)).unwrap_err().contains("at most 256"));
        assert!(name("n", "a\nb").unwrap_err().contains("control"));
        assert!(name("n", "a\u{1b}[31m").is_err());
    }

    #[test]
    fn emails_and_phone_numbers() {
        assert!(email("a@b.example"));
        for bad in ["", "a", "@b.example", "a@b", "a@.b", "a@b.", "a b@c.d", "a@b@c.d", "a\n@b.c"] {
            assert!(!email(bad), "{bad:?}");
        }
        assert!(!email(&format!("{}@b.example", "a".repeat(250))));
        assert!(phone("+14155550100"));
        for bad in ["14155550100", "+1", "+1234567890123456", "+1415555010a", "+"] {
            assert!(!phone(bad), "{bad:?}");
        }
    }
}
