//! Reads on the async executor without waiting: inside [`run`], a store call that would
//! have to wait (every reader connection in use, SQLITE_BUSY while the WAL is reset, the writer's
//! lock) gives up at once, and the caller reruns the work where waiting is allowed. An indexed
//! read that does not wait costs microseconds, far less than a hand-off to another thread.

use std::cell::Cell;

use super::error::StoreError;

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    static GAVE_UP: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` in no-wait mode: `None` when a store call in it would have waited (its result,
/// built from a refused read, is dropped).
pub fn run<T>(f: impl FnOnce() -> T) -> Option<T> {
    ACTIVE.set(true);
    GAVE_UP.set(false);
    let out = f();
    ACTIVE.set(false);
    (!GAVE_UP.replace(false)).then_some(out)
}

/// Whether the current store call must not wait.
pub(crate) fn active() -> bool {
    ACTIVE.get()
}

/// Records that a store call would have waited; the error only unwinds the attempt.
pub(crate) fn give_up() -> StoreError {
    GAVE_UP.set(true);
    StoreError::WouldWait
}
