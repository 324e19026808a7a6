//! Audit outcomes: after every `coffer_audit` "allow" line, exactly one more line says how the
//! allowed operation ended: `outcome = "done"`, or `outcome = "failed"` with the error's type
//! (`error_kind`, and `reason_code` for a refusal after authorization). A sealed blob that does
//! not open under its binding is evidence of tampering (a blob swapped or rewritten in the
//! gateway's database): its line says `tampering = true`, at error level.
//!
//! The authority records each decision it allows ([`record`]) in the scope of the call running
//! on this thread ([`scope`], which every blocking enclave call runs under); when the call
//! returns, the scope writes one outcome line per decision from the call's result. A call whose
//! work goes on after its blocking part (a network fetch, then more HSM work) carries its
//! decisions out with [`carry`] and closes them itself ([`Pending::close`]); dropped unclosed
//! (the caller went away), they are written as failed (`cancelled`). No payload, key or secret is
//! ever part of a line: only the ids the allow line named.

use std::cell::RefCell;

use crate::error::EnclaveError;

/// What an allow line named, for the outcome line that closes it.
#[derive(Debug, Clone)]
pub struct Decision {
    pub operation: &'static str,
    pub organization: String,
    pub credential: String,
    /// The stamped body's fingerprint (a webhook delivery: its event id).
    pub fingerprint: String,
}

thread_local! {
    /// The decisions allowed so far by the call running on this thread (`None` outside a scope).
    static OPEN: RefCell<Option<Vec<Decision>>> = const { RefCell::new(None) };
}

/// Records an allowed decision for the outcome of the call running on this thread. Outside a
/// [`scope`] (no enclave call: the operator commands, unit tests) nothing is recorded.
pub fn record(d: Decision) {
    OPEN.with(|open| {
        if let Some(open) = open.borrow_mut().as_mut() {
            open.push(d);
        }
    });
}

/// Takes the decisions recorded so far in this thread's scope: the caller writes their outcome.
pub fn carry() -> Pending {
    Pending(OPEN.with(|open| open.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default()))
}

/// Runs `f` (one blocking enclave call) in a scope of its own, then writes the outcome of every
/// decision it recorded and did not [`carry`] out: from `f`'s result, or `panicked`.
pub fn scope<T>(f: impl FnOnce() -> Result<T, EnclaveError>) -> Result<T, EnclaveError> {
    /// Ends the scope even if `f` panics.
    struct Scope;
    impl Drop for Scope {
        fn drop(&mut self) {
            // Still open here only when `f` panicked: its decisions failed.
            for d in OPEN.with(|open| open.borrow_mut().take()).unwrap_or_default() {
                write(&d, Err(Failure::Panicked));
            }
        }
    }
    OPEN.with(|open| *open.borrow_mut() = Some(Vec::new()));
    let scope = Scope;
    let result = f();
    let decisions = OPEN.with(|open| open.borrow_mut().take()).unwrap_or_default();
    drop(scope);
    Pending(decisions).close(result.as_ref().map(|_| ()));
    result
}

/// Decisions whose outcome is not written yet ([`carry`]).
#[must_use = "a carried decision must be closed with its outcome"]
#[derive(Debug, Default)]
pub struct Pending(Vec<Decision>);

impl Pending {
    /// Writes the outcome of each decision: done, or failed with `result`'s error.
    pub fn close(mut self, result: Result<(), &EnclaveError>) {
        for d in std::mem::take(&mut self.0) {
            write(&d, result.map_err(Failure::Error));
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        for d in std::mem::take(&mut self.0) {
            write(&d, Err(Failure::Cancelled));
        }
    }
}

/// Why an allowed operation did not complete.
enum Failure<'a> {
    Error(&'a EnclaveError),
    /// The caller went away (the request's future was dropped) before it ended.
    Cancelled,
    Panicked,
}

fn write(d: &Decision, result: Result<(), Failure<'_>>) {
    let (error_kind, reason_code, tampering) = match &result {
        Ok(()) => {
            tracing::info!(
                target: "coffer_audit",
                outcome = "done",
                operation = d.operation,
                organization = %d.organization,
                credential = %d.credential,
                fingerprint = %d.fingerprint,
                "enclave outcome"
            );
            return;
        }
        Err(Failure::Error(e)) => {
            (e.kind(), e.refusal_reason().map(|r| r.as_str_name()).unwrap_or_default(), e.is_tampering())
        }
        Err(Failure::Cancelled) => ("cancelled", "", false),
        Err(Failure::Panicked) => ("panicked", "", false),
    };
    if tampering {
        tracing::error!(
            target: "coffer_audit",
            outcome = "failed",
            tampering = true,
            error_kind,
            operation = d.operation,
            organization = %d.organization,
            credential = %d.credential,
            fingerprint = %d.fingerprint,
            "enclave outcome: sealed key material did not open under its binding (possible tampering with the database)"
        );
    } else {
        tracing::warn!(
            target: "coffer_audit",
            outcome = "failed",
            tampering = false,
            error_kind,
            reason_code,
            operation = d.operation,
            organization = %d.organization,
            credential = %d.credential,
            fingerprint = %d.fingerprint,
            "enclave outcome"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision() -> Decision {
        Decision { operation: "sign", organization: "o".into(), credential: "c".into(), fingerprint: "f".into() }
    }

    #[test]
    fn a_scope_closes_what_it_recorded_and_a_carried_decision_leaves_it() {
        // Recorded in a scope: taken out by the scope (nothing is left open on the thread).
        let r = scope(|| {
            record(decision());
            Ok(1)
        });
        assert_eq!(r.unwrap(), 1);
        assert!(OPEN.with(|o| o.borrow().is_none()));
        let carried = scope(|| {
            record(decision());
            Ok(carry())
        })
        .unwrap();
        assert_eq!(carried.0.len(), 1, "carried out of the scope, not closed by it");
        carried.close(Err(&EnclaveError::SealAuthentication));
        // Outside a scope nothing is recorded.
        record(decision());
        assert!(carry().0.is_empty());
        // A panic inside a scope leaves no scope open behind it.
        let panicked = std::panic::catch_unwind(|| {
            scope::<()>(|| {
                record(decision());
                panic!("boom")
            })
        });
        assert!(panicked.is_err());
        assert!(OPEN.with(|o| o.borrow().is_none()));
    }
}
