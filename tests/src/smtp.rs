//! A real SMTP server for the one-time code tests and the bench: aiosmtpd (Debian's
//! python3-aiosmtpd, installed by `make deps`) on a free port, keeping what it receives in a
//! maildir. Killed when dropped.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct SmtpServer {
    child: Child,
    pub port: u16,
    maildir: PathBuf,
}

impl SmtpServer {
    /// Starts the server with its maildir under `dir`, and waits until it listens.
    pub async fn start(dir: &Path) -> SmtpServer {
        let port = crate::free_port();
        let maildir = dir.join("maildir");
        let child = Command::new("/usr/bin/python3")
            .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}"), "-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&maildir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("aiosmtpd (apt install python3-aiosmtpd, or `make deps`)");
        let t = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(t.elapsed() < Duration::from_secs(20), "aiosmtpd did not listen");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        SmtpServer { child, port, maildir }
    }

    /// `smtp://127.0.0.1:PORT`, for the enclave's `COFFER_SMTP_URL`.
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Every message received so far: its file and its raw text.
    pub fn messages(&self) -> Vec<(PathBuf, String)> {
        let files: Vec<PathBuf> = std::fs::read_dir(self.maildir.join("new"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.into_iter().filter_map(|f| std::fs::read_to_string(&f).ok().map(|m| (f, m))).collect()
    }

    /// The files received so far (to tell the next message from them).
    pub fn seen(&self) -> HashSet<PathBuf> {
        self.messages().into_iter().map(|(f, _)| f).collect()
    }

    /// The code of the one message to `to` among those not in `seen`, and the message.
    #[track_caller]
    pub fn code_for(&self, seen: &HashSet<PathBuf>, to: &str) -> (String, String) {
        let new: Vec<String> = self
            .messages()
            .into_iter()
            .filter(|(f, m)| !seen.contains(f) && m.contains(&format!("To: {to}")))
            .map(|(_, m)| m)
            .collect();
        assert_eq!(new.len(), 1, "one message to {to} expected, got {}", new.len());
        let m = new[0].clone();
        (code_in(&m).unwrap_or_else(|| panic!("no code in {m}")), m)
    }
}

/// The code a message's text says (`… code is: CODE`).
pub fn code_in(m: &str) -> Option<String> {
    m.lines().find(|l| l.contains("code is: ")).map(|l| l.split("code is: ").nth(1).unwrap_or("").trim().to_string())
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
