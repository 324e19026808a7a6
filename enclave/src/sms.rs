//! The enclave's SMS transport for one-time codes: one HTTP POST per message to the provider the
//! enclave's configuration names (Twilio-style APIs: a URL, an `Authorization` header kept in a
//! file, and a body template), with the enclave's one HTTP client (`egress`). Nothing here logs a
//! message.

use zeroize::Zeroizing;

use crate::config::OtpSettings;
use crate::error::EnclaveError;

/// Where the enclave's text messages go.
pub enum SmsSender {
    Http {
        url: url::Url,
        /// The `Authorization` header's value (e.g. `Basic …`), from `sms_authorization_file`.
        authorization: Option<Zeroizing<String>>,
        content_type: String,
        body_template: String,
    },
    /// No provider is configured: SMS codes are refused.
    None,
}

impl SmsSender {
    /// The provider `[otp]` configures (`sms_url`, `https`, or `http` to a loopback host).
    pub fn from_settings(s: &OtpSettings) -> anyhow::Result<Self> {
        let Some(url) = &s.sms_url else { return Ok(Self::None) };
        let url = crate::config::provider_url(url).map_err(|e| anyhow::anyhow!("[otp] sms_url: {e}"))?;
        let authorization = match &s.sms_authorization_file {
            Some(p) => {
                let text = Zeroizing::new(
                    std::fs::read_to_string(p)
                        .map_err(|e| anyhow::anyhow!("reading sms_authorization_file {}: {e}", p.display()))?,
                );
                Some(Zeroizing::new(text.lines().next().unwrap_or("").trim().to_string()))
            }
            None => None,
        };
        for placeholder in ["{to}", "{message}"] {
            if !s.sms_body_template.contains(placeholder) {
                anyhow::bail!("[otp] sms_body_template must contain {placeholder}");
            }
        }
        Ok(Self::Http {
            url,
            authorization,
            content_type: s.sms_content_type.clone(),
            body_template: s.sms_body_template.clone(),
        })
    }

    /// Whether a text can be sent at all.
    pub fn configured(&self) -> bool {
        !matches!(self, Self::None)
    }

    /// What the start-up log says about where texts go (no credentials).
    pub fn describe(&self) -> String {
        match self {
            Self::Http { url, .. } => {
                format!("SMS one-time codes are posted to {}", url.origin().ascii_serialization())
            }
            Self::None => "no SMS provider: SMS one-time codes are refused (set [otp] sms_url)".into(),
        }
    }

    /// The request body: the template with `{to}` and `{message}` replaced, each encoded for the
    /// content type (JSON string contents, or form-urlencoded).
    fn body(template: &str, content_type: &str, to: &str, message: &str) -> Zeroizing<String> {
        let encode = |v: &str| -> String {
            if content_type.starts_with("application/json") {
                let quoted = serde_json::Value::String(v.to_string()).to_string();
                quoted[1..quoted.len() - 1].to_string()
            } else {
                url::form_urlencoded::byte_serialize(v.as_bytes()).collect()
            }
        };
        let message = Zeroizing::new(encode(message));
        Zeroizing::new(template.replace("{to}", &encode(to)).replace("{message}", &message))
    }

    /// Sends `message` to `to` (E.164). A provider failure says its status for the operator's
    /// log, never the message.
    pub async fn send(&self, to: &str, message: &str) -> Result<(), EnclaveError> {
        let Self::Http { url, authorization, content_type, body_template } = self else {
            return Err(EnclaveError::invalid("SMS one-time codes need the enclave's SMS provider ([otp] sms_url)"));
        };
        let body = Self::body(body_template, content_type, to, message);
        let mut req = crate::egress::client()
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, content_type.as_str())
            .body(body.as_bytes().to_vec());
        if let Some(a) = authorization {
            req = req.header(reqwest::header::AUTHORIZATION, a.as_str());
        }
        let failed = |what: String| {
            tracing::warn!(error = %what, "a one-time code could not be sent by SMS");
            EnclaveError::Upstream("the one-time code could not be sent: the enclave's SMS provider failed".into())
        };
        match req.send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(failed(format!("the SMS provider answered {}", r.status()))),
            Err(e) => Err(failed(format!("the SMS provider could not be reached: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_encodes_for_its_content_type() {
        let form = SmsSender::body("To={to}&Body={message}", "application/x-www-form-urlencoded", "+155", "a b&c=1");
        assert_eq!(form.as_str(), "To=%2B155&Body=a+b%26c%3D1");
        let json = SmsSender::body(r#"{"to":"{to}","text":"{message}"}"#, "application/json", "+155", "say \"hi\"\n");
        assert_eq!(json.as_str(), r#"{"to":"+155","text":"say \"hi\"\n"}"#);
    }
}
