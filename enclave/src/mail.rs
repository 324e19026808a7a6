//! The enclave's mail transport for one-time codes: SMTP (plain on loopback, STARTTLS or implicit
//! TLS, with authentication) or, for development, `.eml` files in a directory. Messages are
//! built with `lettre` (a MIME message, plain text and HTML); nothing here logs a message body.

use std::time::Duration;

use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::config::OtpSettings;
use crate::error::EnclaveError;

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
