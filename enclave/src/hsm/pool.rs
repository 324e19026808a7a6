//! The bounded session pool: at most `limit` PKCS#11 sessions open for operations at once; a
//! caller past the limit waits for one to come back; idle sessions are kept for reuse.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use cryptoki::session::Session;

use super::error::HsmError;

pub(super) struct SessionPool {
    state: Mutex<PoolState>,
    returned: Condvar,
    limit: usize,
    /// The most sessions ever open at once (for tests and metrics).
    peak: AtomicUsize,
}

struct PoolState {
    idle: Vec<Session>,
    /// Sessions open: idle ones and leased ones.
    open: usize,
}

/// A session taken from the pool: goes back to it when dropped, unless it saw an error
/// (`discard`), after which it is closed (an abandoned operation would wedge it).
pub(crate) struct Lease<'a> {
    pool: &'a SessionPool,
    session: Option<Session>,
}

impl SessionPool {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            state: Mutex::new(PoolState { idle: Vec::new(), open: 0 }),
            returned: Condvar::new(),
            limit: limit.max(1),
            peak: AtomicUsize::new(0),
        }
    }

    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    pub(super) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// An idle session, a new one from `open` while under the limit, or the next one returned.
    pub(super) fn take(&self, open: impl Fn() -> Result<Session, HsmError>) -> Result<Lease<'_>, HsmError> {
        let mut state = self.state.lock().map_err(|_| HsmError::Poisoned)?;
        loop {
            if let Some(session) = state.idle.pop() {
                return Ok(Lease { pool: self, session: Some(session) });
            }
            if state.open < self.limit {
                state.open += 1;
                self.peak.fetch_max(state.open, Ordering::Relaxed);
                drop(state);
                return match open() {
                    Ok(session) => Ok(Lease { pool: self, session: Some(session) }),
                    Err(e) => {
                        self.closed(1);
                        Err(e)
                    }
                };
            }
            state = self.returned.wait(state).map_err(|_| HsmError::Poisoned)?;
        }
    }

    /// Closes every idle session (after the token dropped the login); leased ones are closed
    /// when their holders see them fail.
    pub(super) fn clear(&self) -> Result<(), HsmError> {
        let idle = {
            let mut state = self.state.lock().map_err(|_| HsmError::Poisoned)?;
            let idle = std::mem::take(&mut state.idle);
            state.open -= idle.len();
            idle
        };
        drop(idle);
        self.returned.notify_all();
        Ok(())
    }

    fn closed(&self, n: usize) {
        if let Ok(mut state) = self.state.lock() {
            state.open -= n;
        }
        self.returned.notify_one();
    }
}

impl Lease<'_> {
    /// Closes the session instead of returning it to the pool.
    pub(super) fn discard(mut self) {
        drop(self.session.take());
        self.pool.closed(1);
    }
}

impl std::ops::Deref for Lease<'_> {
    type Target = Session;

    fn deref(&self) -> &Session {
        // Only `discard` and `drop` take the session out, and both consume the lease.
        let Some(session) = &self.session else { unreachable!("a lease holds its session until it ends") };
        session
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            match self.pool.state.lock() {
                Ok(mut state) => state.idle.push(session),
                Err(_) => return,
            }
            self.pool.returned.notify_one();
        }
    }
}
