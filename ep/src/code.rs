//! What a function's wasm is before it runs: its kind ([`GuestKind`], by its header), its
//! compiled [`Code`], and why it could not be made ready ([`ModuleError`]).
//!
//! The bottom of the EP's wasm side: [`crate::compile`], [`crate::artifacts`] and
//! [`crate::runtime`] share these types. Must not know about jobs, links or the network.

use htfaas_functions::Digest;
use std::time::Duration;
use wasmtime::Module;
use wasmtime::component::Component;

/// Why a module could not be made ready to run. Becomes [`Outcome::ModuleFailed`](htfaas_functions::proto::Outcome::ModuleFailed).
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The bytes are not the ones the job named.
    #[error("digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What the job named.
        expected: Digest,
        /// What the bytes hash to.
        actual: Digest,
    },
    /// Cranelift refused the bytes (not wasm, unsupported proposal, …).
    #[error("compile: {0}")]
    Compile(String),
    /// Not a WASI command: a preview 1 module without `_start`, a preview 2 component that does
    /// not export `wasi:cli/run`, or imports we do not offer.
    #[error("not a WASI command: {0}")]
    NotACommand(String),
    /// Compiling took longer than [`RuntimeOptions::compile_timeout`](crate::runtime::RuntimeOptions::compile_timeout) (now or on an earlier
    /// try: the refusal is remembered, so the module is not compiled again).
    #[error("compile: took longer than {} s, the EP's compile time limit; module refused", limit.as_secs_f64())]
    CompileTimeout {
        /// The limit.
        limit: Duration,
    },
}

/// Which kind of wasm binary a guest is, by its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestKind {
    /// A core module, run as a WASI preview 1 command (`_start`).
    Module,
    /// A component, run as a WASI preview 2 command (`wasi:cli/run`).
    Component,
}

impl GuestKind {
    /// The kind `bytes` declare: a component's header has layer 1 (`\0asm`, version 0x0d,
    /// layer 1), anything else is compiled as a core module (and refused by cranelift if it is
    /// not one).
    pub fn of(bytes: &[u8]) -> GuestKind {
        match bytes.get(..8) {
            Some([0, b'a', b's', b'm', _, _, 1, 0]) => GuestKind::Component,
            _ => GuestKind::Module,
        }
    }
}

/// Compiled code of either guest kind, before linking.
pub(crate) enum Code {
    Module(Module),
    Component(Component),
}

impl Code {
    pub(crate) fn serialize(&self) -> wasmtime::Result<Vec<u8>> {
        match self {
            Code::Module(m) => m.serialize(),
            Code::Component(c) => c.serialize(),
        }
    }
}
