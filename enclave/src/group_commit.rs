//! The hand-off the group commits use (replay entries, state changes, activity log appends): a
//! caller that finds no group running leads one; every other caller waits for its answer or for
//! the lead.

use std::sync::mpsc;

/// What a waiting caller receives: its answer, or the lead of the next group.
pub enum Turn<T> {
    Answer(T),
    Lead,
}

/// The sending end a waiting caller leaves with its entry (room for the lead and the answer, so
/// that a leader never blocks on it).
pub type Reply<T> = mpsc::SyncSender<Turn<T>>;

/// A new reply channel.
pub fn channel<T>() -> (Reply<T>, mpsc::Receiver<Turn<T>>) {
    mpsc::sync_channel(2)
}

/// Waits for the caller's answer, leading a group with `lead_one` whenever the lead is its own
/// (`lead` at first: it found no group running). `abandoned`: the error when the answer can no
/// longer come (its group's leader is gone).
pub fn wait<T, E>(
    answer: &mpsc::Receiver<Turn<Result<T, E>>>,
    mut lead: bool,
    mut lead_one: impl FnMut() -> Result<(), E>,
    abandoned: impl Fn() -> E,
) -> Result<T, E> {
    loop {
        if lead {
            lead_one()?;
        }
        match answer.recv() {
            Ok(Turn::Answer(result)) => return result,
            Ok(Turn::Lead) => lead = true,
            Err(_) => return Err(abandoned()),
        }
    }
}

/// Entries waiting for a group, and whether a group is being led.
pub struct Queue<J> {
    jobs: Vec<J>,
    leading: bool,
}

impl<J> Default for Queue<J> {
    fn default() -> Self {
        Self { jobs: Vec::new(), leading: false }
    }
}

/// The queue's lock was poisoned (a thread panicked holding it).
#[derive(Debug)]
pub struct Poisoned;

/// Adds `job` to the queue: whether its caller leads (no group was being led).
pub fn join<J>(queue: &std::sync::Mutex<Queue<J>>, job: J) -> Result<bool, Poisoned> {
    let mut q = queue.lock().map_err(|_| Poisoned)?;
    q.jobs.push(job);
    Ok(!std::mem::replace(&mut q.leading, true))
}

/// Leads one group: hands at most `max` waiting entries to `commit`, then passes the lead to the
/// owner of the first entry still waiting (`pass_lead`), so that no caller leads for ever under
/// load, or gives it up. Should `commit` panic, the lead is given up, so that the next caller leads.
pub fn lead_one<J>(
    queue: &std::sync::Mutex<Queue<J>>,
    max: usize,
    commit: impl FnOnce(Vec<J>),
    pass_lead: impl FnOnce(&J),
) -> Result<(), Poisoned> {
    struct Unwinding<'a, J>(&'a std::sync::Mutex<Queue<J>>);
    impl<J> Drop for Unwinding<'_, J> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                if let Ok(mut q) = self.0.lock() {
                    q.leading = false;
                }
            }
        }
    }
    let _unwinding = Unwinding(queue);
    let batch: Vec<J> = {
        let mut q = queue.lock().map_err(|_| Poisoned)?;
        let n = q.jobs.len().min(max);
        q.jobs.drain(..n).collect()
    };
    commit(batch);
    let mut q = queue.lock().map_err(|_| Poisoned)?;
    match q.jobs.first() {
        // Its owner waits for its answer; the lead comes first.
        Some(next) => pass_lead(next),
        None => q.leading = false,
    }
    Ok(())
}
