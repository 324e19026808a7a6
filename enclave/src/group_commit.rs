//! The hand-off both group commits use (replay entries, state changes): a caller that finds no
//! group running leads one; every other caller waits for its answer or for the lead.

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
