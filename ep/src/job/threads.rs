//! The threads guests run on, kept between jobs: a job's guest runs on a thread of its own (its
//! CPU time is that thread's, and a guest stuck in a host call can be left behind without
//! blocking the async runtime), but making and ending an OS thread per job cost about 35
//! syscalls and a wake-up each. A thread that finished its job waits [`IDLE_FOR`] for the
//! next one, at most [`KEEP_IDLE`] of them; a thread left behind comes back once its call
//! returns.
//!
//! Must not know: what a task does (jobs, guests, the link).

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most idle threads kept.
const KEEP_IDLE: usize = 16;
/// How long an idle thread waits for a task before it ends.
const IDLE_FOR: Duration = Duration::from_secs(60);

/// One task: run once, on a guest thread.
type Task = Box<dyn FnOnce() + Send>;

/// The idle threads: each one's number and the sender of its tasks.
type Idle = Mutex<Vec<(u64, Sender<Task>)>>;

/// Guest threads, the idle ones listed.
#[derive(Default)]
pub(crate) struct GuestThreads {
    idle: Arc<Idle>,
    next: std::sync::atomic::AtomicU64,
}

impl GuestThreads {
    /// Runs `task` on an idle thread, or on a new one named `name`.
    pub(crate) fn run(&self, name: &str, task: Task) -> std::io::Result<()> {
        let mut task = task;
        loop {
            let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let Some((_, sender)) = idle else { break };
            match sender.send(task) {
                Ok(()) => return Ok(()),
                // It ended meanwhile (its wait ran out): the next one, or a new thread.
                Err(std::sync::mpsc::SendError(back)) => task = back,
            }
        }
        let (sender, receiver) = std::sync::mpsc::channel::<Task>();
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let idle = self.idle.clone();
        std::thread::Builder::new().name(name.to_owned()).spawn(move || serve(id, task, &sender, &receiver, &idle))?;
        Ok(())
    }

    /// Idle threads now (for tests).
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A guest thread's life: `first`, then each task it is sent, until no task comes within
/// [`IDLE_FOR`] or [`KEEP_IDLE`] threads already wait.
fn serve(id: u64, first: Task, sender: &Sender<Task>, receiver: &Receiver<Task>, idle: &Idle) {
    let mut task = first;
    loop {
        task();
        {
            let mut waiting = idle.lock().unwrap_or_else(|p| p.into_inner());
            if waiting.len() >= KEEP_IDLE {
                return;
            }
            waiting.push((id, sender.clone()));
        }
        match receiver.recv_timeout(IDLE_FOR) {
            Ok(next) => task = next,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                // Out of the list first; a task sent between the timeout and here is still run.
                idle.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
                match receiver.try_recv() {
                    Ok(next) => task = next,
                    Err(_) => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks one after another run on one thread, which then waits idle; tasks at once get
    /// threads of their own.
    #[test]
    fn a_thread_runs_the_next_task_and_concurrent_tasks_get_their_own() {
        let pool = GuestThreads::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let tx = tx.clone();
            pool.run("t", Box::new(move || tx.send(std::thread::current().id()).expect("send"))).expect("run");
            ids.push(rx.recv().expect("ran"));
            // Once it is back in the list, the next task goes to it.
            while pool.idle() == 0 {
                std::thread::yield_now();
            }
        }
        assert!(ids.windows(2).all(|w| w[0] == w[1]), "one thread, reused: {ids:?}");
        // Two tasks at once: the second cannot wait for the first.
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let first = tx.clone();
        pool.run(
            "t",
            Box::new(move || {
                first.send(std::thread::current().id()).expect("send");
                let _ = gate_rx.recv();
            }),
        )
        .expect("run");
        let a = rx.recv().expect("first ran");
        let second = tx.clone();
        pool.run("t", Box::new(move || second.send(std::thread::current().id()).expect("send"))).expect("run");
        let b = rx.recv().expect("second ran while the first waits");
        assert_ne!(a, b);
        drop(gate_tx);
    }
}
