//! A guest's bounded stdout and stderr: one in-memory buffer of `log_limit_bytes`; what does
//! not fit is counted and dropped, never an error for the guest.
//!
//! Below the runtime: it knows WASI's stream traits, nothing of jobs or reports.

use std::sync::{Arc, Mutex};

/// Which guest stream a pipe feeds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stream {
    Out,
    Err,
}

#[derive(Default)]
pub(crate) struct LogState {
    out: Vec<u8>,
    err: Vec<u8>,
    dropped: u64,
}

/// stdout and stderr of one run, sharing one byte budget. Unlike wasmtime-wasi's
/// `MemoryOutputPipe`, a full buffer never traps or errors the guest: extra bytes are counted
/// and dropped.
pub(crate) struct LogBuffer {
    cap: usize,
    state: Arc<Mutex<LogState>>,
}

impl LogBuffer {
    pub(crate) fn new(cap: usize) -> LogBuffer {
        LogBuffer { cap, state: Arc::default() }
    }

    pub(crate) fn pipe(&self, stream: Stream) -> LogPipe {
        LogPipe { cap: self.cap, stream, state: self.state.clone() }
    }

    pub(crate) fn take(&self) -> (Vec<u8>, Vec<u8>, u64) {
        let mut s = self.state.lock().expect("log lock poisoned");
        (std::mem::take(&mut s.out), std::mem::take(&mut s.err), s.dropped)
    }
}

#[derive(Clone)]
pub(crate) struct LogPipe {
    cap: usize,
    stream: Stream,
    state: Arc<Mutex<LogState>>,
}

impl LogPipe {
    fn push(&self, bytes: &[u8]) {
        let mut s = self.state.lock().expect("log lock poisoned");
        let room = self.cap.saturating_sub(s.out.len() + s.err.len());
        let take = room.min(bytes.len());
        match self.stream {
            Stream::Out => s.out.extend_from_slice(&bytes[..take]),
            Stream::Err => s.err.extend_from_slice(&bytes[..take]),
        }
        s.dropped += (bytes.len() - take) as u64;
    }
}

impl wasmtime_wasi::cli::IsTerminal for LogPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdoutStream for LogPipe {
    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::Pollable for LogPipe {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::OutputStream for LogPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> wasmtime_wasi::p2::StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> wasmtime_wasi::p2::StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> wasmtime_wasi::p2::StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for LogPipe {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.push(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
