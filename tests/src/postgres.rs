//! A private PostgreSQL server for the tests, started once per test binary with the launcher's
//! own script (`deploy/postgres-private.sh`), and a fresh database for each store that asks.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The server of this test process; it stops when the process ends (a watchdog sees to it).
pub struct PgServer {
    url: String,
    dir: PathBuf,
    /// Outlives this process by design (it stops the server after it); never waited for.
    _watchdog: std::process::Child,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/postgres-private.sh")
}

/// Starts the server the first time it is asked for.
pub fn server() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        // Directly under the temporary directory: the server's user (not root) must reach it.
        let dir = std::env::temp_dir().join(format!("coffer-pg-{}", std::process::id()));
        let out = Command::new("bash").arg(script()).arg("start").arg(&dir).output().expect("running the script");
        assert!(out.status.success(), "starting PostgreSQL: {}", String::from_utf8_lossy(&out.stderr));
        let url = String::from_utf8(out.stdout).unwrap().trim().to_string();
        // Stops the server and removes its files once this process is gone, however it ends.
        let watchdog = Command::new("sh")
            .args([
                "-c",
                r#"while kill -0 "$0" 2>/dev/null; do sleep 0.5; done; bash "$1" stop "$2"; rm -rf "$2""#,
                &std::process::id().to_string(),
            ])
            .arg(script())
            .arg(&dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting the watchdog");
        PgServer { url, dir, _watchdog: watchdog }
    })
}

impl PgServer {
    /// The server's main process (its backends are its children), from its pid file.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let pid_file = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        pid_file.lines().next()?.trim().parse().ok()
    }

    /// The URL of a new, empty database on this server.
    pub fn fresh_database(&self) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("t{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let url = self.url.clone();
        let create = format!("CREATE DATABASE {name}");
        // Off any async runtime: the blocking client runs one of its own.
        std::thread::spawn(move || {
            let mut admin = postgres::Client::connect(&url, postgres::NoTls).expect("connecting to PostgreSQL");
            admin.batch_execute(&create).expect("creating a database");
        })
        .join()
        .unwrap();
        let base = self.url.rsplit_once('/').map(|(base, _)| base).unwrap_or(&self.url);
        format!("{base}/{name}")
    }
}

/// Which store the end-to-end stacks of this run use: `COFFER_TEST_STORE=postgres` or SQLite.
pub fn store_under_test() -> &'static str {
    match std::env::var("COFFER_TEST_STORE").as_deref() {
        Ok("postgres") => "postgres",
        Ok("sqlite") | Ok("") | Err(_) => "sqlite",
        Ok(other) => panic!("COFFER_TEST_STORE={other:?}: expected sqlite or postgres"),
    }
}
