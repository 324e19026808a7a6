//! A WebDriver client over reqwest: Debian's headless Chromium via chromedriver, with passkey virtual authenticators.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

/// The W3C key under which a web element reference carries its id.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long the `wait_*` helpers poll before failing the test, and how often.
const WAIT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);

const INSTALL: &str = "chromedriver and chromium must be installed (deploy/install-deps.sh)";

/// `$COFFER_CHROMEDRIVER`, else Debian's `/usr/bin/chromedriver`.
fn chromedriver_path() -> PathBuf {
    std::env::var_os("COFFER_CHROMEDRIVER").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/chromedriver"))
}

/// `$COFFER_CHROMIUM`, else Debian's `/usr/bin/chromium`.
fn chromium_path() -> PathBuf {
    std::env::var_os("COFFER_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

/// Whether chromedriver and Chromium are installed (tests needing a browser can skip without).
pub fn chromium_present() -> bool {
    chromedriver_path().is_file() && chromium_path().is_file()
}

/// A W3C error reply: `value.error` (the code, e.g. `no such element`) and `value.message`.
#[derive(Debug)]
struct WdError {
    error: String,
    message: String,
}

/// A headless Chromium session behind its own chromedriver. Chromedriver, Chromium and the
/// profile directory are gone when dropped.
pub struct Browser {
    chromedriver: Child,
    base_url: String,
    session: String,
    client: reqwest::Client,
    user_data_dir: PathBuf,
    /// Whether the session is deleted already ([`Browser::quit`]).
    quitted: bool,
}

impl Browser {
    /// Starts chromedriver on a free port, waits until it is ready, and opens a session with a
    /// fresh profile.
    pub async fn start() -> Browser {
        let port = crate::free_port();
        let driver = chromedriver_path();
        let chromedriver = Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {} ({e}): {INSTALL}", driver.display()));
        static PROFILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = PROFILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let user_data_dir = std::env::temp_dir().join(format!("coffer-chromium-{}-{n}", std::process::id()));
        // A directory left by a crashed run whose process had the same id.
        let _ = std::fs::remove_dir_all(&user_data_dir);
        std::fs::create_dir_all(&user_data_dir).unwrap();
        let client =
            reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(120)).build().expect("reqwest client");
        let mut browser = Browser {
            chromedriver,
            base_url: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            client,
            user_data_dir,
            quitted: true,
        };
        browser.wait_ready().await;

        let chromium = chromium_path();
        assert!(chromium.is_file(), "no {}: {INSTALL}", chromium.display());
        let capabilities = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chromium.to_string_lossy(),
                        "args": [
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-dev-shm-usage",
                            "--window-size=1280,1000",
                            format!("--user-data-dir={}", browser.user_data_dir.display()),
                            "--no-first-run",
                        ],
                    },
                    "webauthn:virtualAuthenticators": true,
                    "timeouts": { "implicit": 0, "pageLoad": 30000, "script": 30000 },
                }
            }
        });
        let url = format!("{}/session", browser.base_url);
        let reply = Self::send(&browser.client, reqwest::Method::POST, &url, Some(capabilities)).await;
        let value = reply.unwrap_or_else(|e| panic!("WebDriver new session: {}: {}", e.error, e.message));
        browser.session = value["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("new session reply without sessionId: {value}"))
            .into();
        browser.quitted = false;
        browser
    }

    /// Polls `GET /status` until chromedriver says it is ready (30 s).
    async fn wait_ready(&mut self) {
        let t = Instant::now();
        let url = format!("{}/status", self.base_url);
        loop {
            if let Ok(Some(status)) = self.chromedriver.try_wait() {
                panic!("chromedriver exited ({status}) before it was ready: {INSTALL}");
            }
            if let Ok(reply) = self.client.get(&url).timeout(Duration::from_secs(2)).send().await {
                if let Ok(body) = reply.json::<Value>().await {
                    if body["value"]["ready"] == json!(true) {
                        return;
                    }
                }
            }
            assert!(t.elapsed() < Duration::from_secs(30), "chromedriver not ready after 30 s on {}", self.base_url);
            tokio::time::sleep(POLL).await;
        }
    }

    /// Deletes the session (chromedriver closes Chromium), then stops chromedriver.
    pub async fn quit(mut self) {
        if !self.quitted {
            let url = self.url("");
            if let Err(e) = Self::send(&self.client, reqwest::Method::DELETE, &url, None).await {
                panic!("WebDriver delete session: {}: {}", e.error, e.message);
            }
            self.quitted = true;
        }
    }

    /// The session's URL for `path` (`""` or starting with `/`).
    fn url(&self, path: &str) -> String {
        format!("{}/session/{}{path}", self.base_url, self.session)
    }

    /// Sends one command and returns its `value`, or the W3C error.
    async fn send(
        client: &reqwest::Client,
        method: reqwest::Method,
        url: &str,
        body: Option<Value>,
    ) -> Result<Value, WdError> {
        let mut request = client.request(method.clone(), url);
        // Chromedriver wants a JSON body (`{}` at least) on every POST.
        if method == reqwest::Method::POST {
            request = request.json(&body.unwrap_or_else(|| json!({})));
        }
        let reply = request.send().await.unwrap_or_else(|e| panic!("WebDriver {method} {url}: {e}"));
        let status = reply.status();
        let text = reply.text().await.unwrap_or_else(|e| panic!("WebDriver {method} {url}: reading the reply: {e}"));
        let mut body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("WebDriver {method} {url}: {status}, not JSON ({e}): {text}"));
        let value = body["value"].take();
        if let Some(error) = value.get("error").and_then(Value::as_str) {
            let message = value.get("message").and_then(Value::as_str).unwrap_or("").to_string();
            return Err(WdError { error: error.to_string(), message });
        }
        assert!(status.is_success(), "WebDriver {method} {url}: {status}: {text}");
        Ok(value)
    }

    /// A session command; `Err` for a W3C error reply.
    async fn try_command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, WdError> {
        Self::send(&self.client, method, &self.url(path), body).await
    }

    /// A session command; panics on a W3C error reply.
    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        match self.try_command(method.clone(), path, body).await {
            Ok(v) => v,
            Err(e) => panic!("WebDriver {method} {path}: {}: {}", e.error, e.message),
        }
    }

    async fn get(&self, path: &str) -> Value {
        self.command(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.command(reqwest::Method::POST, path, Some(body)).await
    }

    // --- navigation -------------------------------------------------------------------------------

    /// Opens `url` and waits until it has loaded.
    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await;
    }

    pub async fn current_url(&self) -> String {
        self.get("/url").await.as_str().unwrap_or_default().to_string()
    }

    pub async fn title(&self) -> String {
        self.get("/title").await.as_str().unwrap_or_default().to_string()
    }

    // --- elements ---------------------------------------------------------------------------------

    /// The first element matching the CSS selector now, by its WebDriver id.
    pub async fn find(&self, css: &str) -> Option<String> {
        let body = json!({ "using": "css selector", "value": css });
        match self.try_command(reqwest::Method::POST, "/element", Some(body)).await {
            Ok(v) => Some(element_id(&v)),
            Err(e) if e.error == "no such element" => None,
            Err(e) => panic!("WebDriver find {css:?}: {}: {}", e.error, e.message),
        }
    }

    /// Every element matching the CSS selector now.
    pub async fn find_all(&self, css: &str) -> Vec<String> {
        let v = self.post("/elements", json!({ "using": "css selector", "value": css })).await;
        v.as_array().map(|a| a.iter().map(element_id).collect()).unwrap_or_default()
    }

    /// The first element matching `css`, once there is one (15 s).
    pub async fn wait_for(&self, css: &str) -> String {
        let t = Instant::now();
        loop {
            if let Some(id) = self.find(css).await {
                return id;
            }
            if t.elapsed() > WAIT {
                self.fail(&format!("no element {css:?} after {} s", WAIT.as_secs())).await;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until some element matching `css` has `needle` in its text (15 s).
    pub async fn wait_for_text(&self, css: &str, needle: &str) {
        let t = Instant::now();
        let script =
            "return Array.from(document.querySelectorAll(arguments[0])).some(e => e.innerText.includes(arguments[1]));";
        loop {
            if self.execute(script, vec![json!(css), json!(needle)]).await == json!(true) {
                return;
            }
            if t.elapsed() > WAIT {
                self.fail(&format!("no element {css:?} with text {needle:?} after {} s", WAIT.as_secs())).await;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until no element matches `css` (15 s).
    pub async fn wait_gone(&self, css: &str) {
        let t = Instant::now();
        while self.find(css).await.is_some() {
            if t.elapsed() > WAIT {
                self.fail(&format!("element {css:?} still there after {} s", WAIT.as_secs())).await;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Clicks the first element matching `css`, once there is one and it takes the click (15 s).
    pub async fn click(&self, css: &str) {
        let t = Instant::now();
        loop {
            let id = self.wait_for(css).await;
            match self.try_command(reqwest::Method::POST, &format!("/element/{id}/click"), None).await {
                Ok(_) => return,
                // Not laid out yet, covered by something fading away, or re-rendered meanwhile.
                Err(e)
                    if t.elapsed() < WAIT
                        && matches!(
                            e.error.as_str(),
                            "element not interactable" | "element click intercepted" | "stale element reference"
                        ) =>
                {
                    tokio::time::sleep(POLL).await
                }
                Err(e) => self.fail(&format!("click {css:?}: {}: {}", e.error, e.message)).await,
            }
        }
    }

    /// Clicks an element by its WebDriver id.
    pub async fn click_element(&self, id: &str) {
        self.post(&format!("/element/{id}/click"), json!({})).await;
    }

    /// Replaces the value of the first input matching `css` by typing `text`.
    pub async fn fill(&self, css: &str, text: &str) {
        let id = self.wait_for(css).await;
        self.post(&format!("/element/{id}/clear"), json!({})).await;
        self.post(&format!("/element/{id}/value"), json!({ "text": text })).await;
    }

    /// Chooses the option of value `value` in the first `<select>` matching `css`.
    pub async fn select(&self, css: &str, value: &str) {
        self.wait_for(css).await;
        let script = "const e = document.querySelector(arguments[0]); e.value = arguments[1]; \
             if (e.value !== arguments[1]) return false; \
             e.dispatchEvent(new Event('input', { bubbles: true })); \
             e.dispatchEvent(new Event('change', { bubbles: true })); return true;";
        if self.execute(script, vec![json!(css), json!(value)]).await != json!(true) {
            self.fail(&format!("select {css:?} has no option {value:?}")).await;
        }
    }

    /// The text (`innerText`) of the first element matching `css`, once there is one.
    pub async fn text(&self, css: &str) -> String {
        let id = self.wait_for(css).await;
        let v = self.execute("return arguments[0].innerText;", vec![json!({ ELEMENT_KEY: id })]).await;
        v.as_str().unwrap_or_default().to_string()
    }

    /// The texts (`innerText`) of every element matching `css` now.
    pub async fn texts(&self, css: &str) -> Vec<String> {
        let script = "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText);";
        let v = self.execute(script, vec![json!(css)]).await;
        v.as_array().map(|a| a.iter().map(|s| s.as_str().unwrap_or_default().to_string()).collect()).unwrap_or_default()
    }

    /// The attribute `name` of the first element matching `css` (once there is one), if it has it.
    pub async fn attribute(&self, css: &str, name: &str) -> Option<String> {
        let id = self.wait_for(css).await;
        self.get(&format!("/element/{id}/attribute/{name}")).await.as_str().map(str::to_string)
    }

    /// Runs `script` (a function body: `arguments`, `return`) in the page; a promise returned
    /// is awaited.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": args })).await
    }

    /// Runs `script` in the page, which ends by calling its last argument with the result.
    pub async fn execute_async(&self, script: &str, args: Vec<Value>) -> Value {
        self.post("/execute/async", json!({ "script": script, "args": args })).await
    }

    /// Saves a PNG of the viewport to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let v = self.get("/screenshot").await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("screenshot reply is no string"))
            .expect("screenshot reply is no base64");
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// Fails the test with `what` and the start of the page's text.
    async fn fail(&self, what: &str) -> ! {
        let body = self
            .try_command(
                reqwest::Method::POST,
                "/execute/sync",
                Some(json!({ "script": "return document.body ? document.body.innerText : '';", "args": [] })),
            )
            .await;
        let body = match body {
            Ok(v) => v.as_str().unwrap_or_default().chars().take(2000).collect::<String>(),
            Err(e) => format!("(page text unavailable: {}: {})", e.error, e.message),
        };
        let url = match self.try_command(reqwest::Method::GET, "/url", None).await {
            Ok(v) => v.as_str().unwrap_or_default().chars().take(200).collect(),
            Err(_) => String::new(),
        };
        panic!("{what}\n--- page {url} ---\n{body}\n---");
    }

    // --- WebAuthn (virtual authenticators) -------------------------------------------------------

    /// Adds a platform authenticator (CTAP2, internal, resident keys, user verification that
    /// always succeeds, presence simulated) and returns its id.
    pub async fn add_virtual_authenticator(&self) -> String {
        let options = json!({
            "protocol": "ctap2",
            "transport": "internal",
            "hasResidentKey": true,
            "hasUserVerification": true,
            "isUserVerified": true,
            "automaticPresenceSimulation": true,
        });
        let v = self.post("/webauthn/authenticator", options).await;
        v.as_str().unwrap_or_else(|| panic!("add authenticator reply is no id: {v}")).to_string()
    }

    /// The credentials the authenticator holds (`credentialId`, `isResidentCredential`, `rpId`,
    /// `privateKey`, `userHandle`, `signCount`…).
    pub async fn credentials(&self, authenticator_id: &str) -> Vec<Value> {
        let v = self.get(&format!("/webauthn/authenticator/{authenticator_id}/credentials")).await;
        match v {
            Value::Array(a) => a,
            other => panic!("credentials reply is no array: {other}"),
        }
    }

    pub async fn remove_virtual_authenticator(&self, authenticator_id: &str) {
        self.command(reqwest::Method::DELETE, &format!("/webauthn/authenticator/{authenticator_id}"), None).await;
    }
}

/// The id of a web element reference.
fn element_id(v: &Value) -> String {
    v[ELEMENT_KEY].as_str().unwrap_or_else(|| panic!("not an element reference: {v}")).to_string()
}

impl Drop for Browser {
    fn drop(&mut self) {
        // No await here: a plain blocking DELETE of the session, so that chromedriver closes
        // Chromium (killing chromedriver alone would leave Chromium running).
        if !self.quitted {
            let _ = delete_session_blocking(&self.base_url, &self.session);
        }
        let _ = self.chromedriver.kill();
        let _ = self.chromedriver.wait();
        let _ = std::fs::remove_dir_all(&self.user_data_dir);
    }
}

/// `DELETE /session/{id}` over a bare HTTP/1.1 connection, waiting for the reply's head (10 s at most).
fn delete_session_blocking(base_url: &str, session: &str) -> std::io::Result<()> {
    let addr = base_url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "DELETE /session/{session} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    // Chromedriver answers once Chromium is closed, and may keep the connection open after:
    // the end of the reply's head is enough.
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !reply.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
    }
    Ok(())
}
