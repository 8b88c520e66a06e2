//! Compiling a module under a deadline.
//!
//! Cranelift cannot be interrupted, and a module can be crafted to make it slow (huge
//! functions, deep control flow), so a compile runs on a thread of its own and the caller waits
//! at most [`RuntimeOptions::compile_timeout`](crate::runtime::RuntimeOptions::compile_timeout).
//! Past it the module is refused ([`ModuleError::CompileTimeout`]) and its digest remembered,
//! so that every later job of it is refused at once instead of starting another compile: a
//! digest names its bytes, so the answer cannot change. The thread left behind finishes (or
//! not) on its own and its result is dropped; [`Compiler::running_late`] counts such threads.
//!
//! Knows wasmtime's compile entry points and nothing of jobs, caches on disk or the network.

use crate::code::{Code, GuestKind, ModuleError};
use htfaas_functions::Digest;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::Engine;
use wasmtime::component::Component;

/// Most refused digests remembered; past it the set starts again (a refused module then costs
/// one more timed-out compile).
const MAX_REFUSED: usize = 4096;

/// Compiles modules, each within the time limit, and remembers the ones refused.
pub(crate) struct Compiler {
    timeout: Option<Duration>,
    refused: Mutex<HashSet<Digest>>,
    /// Compile threads still running after their caller gave up on them.
    late: Arc<AtomicUsize>,
}

impl Compiler {
    /// A compiler with this limit per module (`None`: unbounded, compiled on the caller's thread).
    pub(crate) fn new(timeout: Option<Duration>) -> Compiler {
        Compiler { timeout, refused: Mutex::new(HashSet::new()), late: Arc::new(AtomicUsize::new(0)) }
    }

    /// Compile threads that outlived their deadline and still run.
    pub(crate) fn running_late(&self) -> usize {
        self.late.load(Ordering::Relaxed)
    }

    /// Compiles `bytes` (whose digest is `digest`) as `kind`, or refuses: cranelift's own
    /// errors as [`ModuleError::Compile`], a compile past the limit, now or before, as
    /// [`ModuleError::CompileTimeout`]. Blocking.
    pub(crate) fn compile(
        &self,
        engine: &Engine,
        digest: &Digest,
        bytes: &[u8],
        kind: GuestKind,
    ) -> Result<Code, ModuleError> {
        let Some(limit) = self.timeout else {
            return compile_now(engine, bytes, kind);
        };
        if self.refused.lock().unwrap_or_else(|p| p.into_inner()).contains(digest) {
            return Err(ModuleError::CompileTimeout { limit });
        }
        // A rendezvous: a send after the receiver dropped fails, so a late thread always knows.
        let (tx, rx) = std::sync::mpsc::sync_channel(0);
        let (engine, owned, late) = (engine.clone(), bytes.to_vec(), self.late.clone());
        let spawned = std::thread::Builder::new().name("ep-compile".into()).spawn(move || {
            let compiled = compile_now(&engine, &owned, kind);
            // The receiver is gone when the caller gave up: this thread was counted late.
            if tx.send(compiled).is_err() {
                late.fetch_sub(1, Ordering::Relaxed);
            }
        });
        if let Err(e) = spawned {
            return Err(ModuleError::Compile(format!("EP could not start a compile thread: {e}")));
        }
        match rx.recv_timeout(limit) {
            Ok(compiled) => compiled,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // Counted before the receiver drops, so the thread's decrement comes after.
                self.late.fetch_add(1, Ordering::Relaxed);
                drop(rx);
                let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
                if refused.len() >= MAX_REFUSED {
                    refused.clear();
                }
                refused.insert(digest.clone());
                tracing::warn!(digest = %digest.short(), ?limit, late = self.running_late(),
                    "module compile passed the time limit: refused, its thread left to finish");
                Err(ModuleError::CompileTimeout { limit })
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(ModuleError::Compile("the compile thread panicked".into()))
            }
        }
    }
}

fn compile_now(engine: &Engine, bytes: &[u8], kind: GuestKind) -> Result<Code, ModuleError> {
    match kind {
        GuestKind::Module => wasmtime::Module::new(engine, bytes).map(Code::Module),
        GuestKind::Component => Component::new(engine, bytes).map(Code::Component),
    }
    .map_err(|e| ModuleError::Compile(format!("{e:#}")))
}
