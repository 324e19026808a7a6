//! The enclave's mail transport for one-time codes: SMTP (plain on loopback, STARTTLS or implicit
//! TLS, with authentication) or, for development, `.eml` files in a directory. Messages are
//! built with `lettre` (a MIME message, plain text and HTML); nothing here logs a message body.

use std::time::Duration;

use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use coffer_proto::v1::EmailEvent;

use crate::config::OtpSettings;
use crate::error::EnclaveError;

/// [`EmailEvent::event_type`] of a message the transport took.
pub const SENT: &str = "Send";
/// [`EmailEvent::event_type`] of a message the transport did not take.
pub const SEND_FAILED: &str = "SendFailure";

/// What the enclave records of `message`, sent for `organization_id`: its ids and addresses,
/// never its content.
pub fn event_of(message: &Message, organization_id: &str, event_type: &str) -> EmailEvent {
    let envelope = message.envelope();
    EmailEvent {
        organization_id: organization_id.to_string(),
        message_id: message.headers().get_raw("Message-ID").unwrap_or_default().to_string(),
        from_address: envelope.from().map(ToString::to_string).unwrap_or_default(),
        to_address: envelope.to().iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        event_type: event_type.to_string(),
        timestamp_ms: crate::admission::now_ms(),
    }
}

/// How long one SMTP conversation may take before the send fails.
const SMTP_TIMEOUT: Duration = Duration::from_secs(15);

/// Where the enclave's messages go.
pub enum Mailer {
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    Dir(AsyncFileTransport<Tokio1Executor>, std::path::PathBuf),
    /// No transport is configured: email codes are refused.
    None,
}

impl Mailer {
    /// The transport `[otp]` configures: `smtp_url` first, else `mail_dir` (created, mode 0700).
    pub fn from_settings(s: &OtpSettings) -> anyhow::Result<Self> {
        if let Some(url) = &s.smtp_url {
            let mut builder = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
                .map_err(|e| anyhow::anyhow!("[otp] smtp_url: {e}"))?
                .timeout(Some(SMTP_TIMEOUT));
            if let Some(password) = s.smtp_password()? {
                let user = url::Url::parse(url).map(|u| u.username().to_string()).unwrap_or_default();
                if user.is_empty() {
                    anyhow::bail!("[otp] smtp_password_file is set but smtp_url names no user (smtp://USER@HOST)");
                }
                builder = builder.credentials(Credentials::new(user, password.to_string()));
            }
            return Ok(Self::Smtp(builder.build()));
        }
        if let Some(dir) = &s.mail_dir {
            std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("[otp] mail_dir {}: {e}", dir.display()))?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| anyhow::anyhow!("[otp] mail_dir {}: {e}", dir.display()))?;
            }
            return Ok(Self::Dir(AsyncFileTransport::new(dir), dir.clone()));
        }
        Ok(Self::None)
    }

    /// What the start-up log says about where codes go (no credentials).
    pub fn describe(&self) -> String {
        match self {
            Self::Smtp(_) => "one-time codes are sent over SMTP ([otp] smtp_url)".into(),
            Self::Dir(_, dir) => format!("one-time codes are written as .eml files to {} (development)", dir.display()),
            Self::None => "no mail transport: email one-time codes are refused (set [otp] smtp_url or mail_dir)".into(),
        }
    }

    /// Whether a message can be sent at all.
    pub fn configured(&self) -> bool {
        !matches!(self, Self::None)
    }

    /// Sends `message`. A failure says what failed (for the operator's log) and never the message.
    pub async fn send(&self, message: Message) -> Result<(), EnclaveError> {
        let failed = |what: String| {
            tracing::warn!(error = %what, "a one-time code could not be sent");
            EnclaveError::Upstream("the one-time code could not be sent: the enclave's mail transport failed".into())
        };
        match self {
            Self::Smtp(t) => t.send(message).await.map(|_| ()).map_err(|e| failed(e.to_string())),
            Self::Dir(t, dir) => match t.send(message).await {
                Ok(id) => {
                    tracing::info!(file = %dir.join(format!("{id}.eml")).display(), "one-time code written (development mail_dir)");
                    Ok(())
                }
                Err(e) => Err(failed(e.to_string())),
            },
            Self::None => Err(EnclaveError::invalid(
                "email one-time codes need the enclave's mail transport ([otp] smtp_url or mail_dir)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_development_transport_writes_one_eml_file_per_message() {
        let dir = std::env::temp_dir().join(format!("coffer-mail-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let settings = OtpSettings { mail_dir: Some(dir.clone()), ..OtpSettings::default() };
        let mailer = Mailer::from_settings(&settings).unwrap();
        assert!(mailer.configured() && mailer.describe().contains(".eml"));
        let message = Message::builder()
            .from("Coffer <no-reply@localhost>".parse().unwrap())
            .to("a@b.test".parse().unwrap())
            .subject("Your code")
            .body("Your code is: 123456".to_string())
            .unwrap();
        mailer.send(message).await.unwrap();
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0].extension().and_then(|e| e.to_str()), Some("eml"));
        let text = std::fs::read_to_string(&files[0]).unwrap();
        assert!(text.contains("To: a@b.test") && text.contains("123456"), "{text}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn without_a_transport_email_is_refused_and_a_password_needs_a_user() {
        let none = Mailer::from_settings(&OtpSettings::default()).unwrap();
        assert!(!none.configured());
        let message =
            Message::builder().from("a@b.test".parse().unwrap()).to("c@d.test".parse().unwrap()).body(String::new());
        assert!(matches!(none.send(message.unwrap()).await, Err(EnclaveError::InvalidArgument(_))));
        let file = std::env::temp_dir().join(format!("coffer-smtp-password-{}", std::process::id()));
        std::fs::write(&file, "secret\n").unwrap();
        let settings = OtpSettings {
            smtp_url: Some("smtp://127.0.0.1:2525".into()),
            smtp_password_file: Some(file.clone()),
            ..OtpSettings::default()
        };
        assert!(Mailer::from_settings(&settings).is_err(), "a password without a user is refused");
        std::fs::remove_file(&file).unwrap();
    }
}
