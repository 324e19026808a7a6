//! Named crash points for the end-to-end kill tests: a debug build dies at a point, as a
//! `kill -9` would there, when the file `COFFER_CRASH_POINT_FILE` names holds that point's name.

/// Dies here (`abort`: no destructor, no flush, no answer) when this is the armed point: the file
/// `COFFER_CRASH_POINT_FILE` names holds `name`. The file is removed first, so the restarted
/// process runs on. Release builds compile every point to nothing; a debug build without the
/// variable reads nothing.
pub fn here(name: &'static str) {
    #[cfg(debug_assertions)]
    {
        static FILE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
        let Some(file) = FILE.get_or_init(|| std::env::var_os("COFFER_CRASH_POINT_FILE").map(Into::into)) else {
            return;
        };
        if std::fs::read_to_string(file).is_ok_and(|armed| armed.trim() == name) && std::fs::remove_file(file).is_ok() {
            std::process::abort();
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}
