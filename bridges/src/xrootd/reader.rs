//! The bridge's input: stdin or a FIFO reopened when replaced, read in lines of at most
//! [`MAX_LINE_BYTES`] ([`LineReader`]).
//!
//! Must not know: the line format, NATS.

use super::parse::LineError;
use super::{FIFO_CHECK, MAX_LINE_BYTES};
use anyhow::Context as _;
use std::path::Path;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio_util::sync::CancellationToken;

/// Reads lines of at most [`MAX_LINE_BYTES`] from a byte stream; a longer line is consumed
/// and reported as [`LineError::TooLong`] without being kept.
pub struct LineReader<R> {
    pub(super) inner: R,
    pub(super) buf: Vec<u8>,
    /// Inside a line that is already too long: drop bytes up to its newline.
    pub(super) discarding: bool,
    pub(super) eof: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// A reader over `inner`.
    pub fn new(inner: R) -> LineReader<R> {
        LineReader { inner, buf: Vec::with_capacity(8192), discarding: false, eof: false }
    }

    /// The next line without its newline, `Err(TooLong)` for an overlong one, `None` at the
    /// end of the input (a last line without a newline is returned first). Cancel-safe: bytes
    /// already read stay buffered.
    pub async fn next_line(&mut self) -> std::io::Result<Option<Result<Vec<u8>, LineError>>> {
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=nl).collect();
                line.pop();
                if std::mem::take(&mut self.discarding) || line.len() > MAX_LINE_BYTES {
                    return Ok(Some(Err(LineError::TooLong)));
                }
                return Ok(Some(Ok(line)));
            }
            if self.discarding {
                self.buf.clear();
            } else if self.buf.len() > MAX_LINE_BYTES {
                self.buf.clear();
                self.discarding = true;
            }
            if self.eof {
                if std::mem::take(&mut self.discarding) {
                    return Ok(Some(Err(LineError::TooLong)));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(Ok(std::mem::take(&mut self.buf))));
            }
            let n = self.inner.read(&mut chunk).await?;
            if n == 0 {
                self.eof = true;
            } else {
                self.buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

pub(super) type BoxedInput = Box<dyn AsyncRead + Unpin + Send>;

/// Standard input as an async reader: a pipe (the program mode) is read without a blocking
/// thread, so that shutdown never waits for a line; anything else through tokio's stdin.
pub(super) fn open_stdin() -> BoxedInput {
    use std::os::fd::AsFd as _;
    let pipe = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok());
    match pipe {
        Some(p) => Box::new(p),
        None => Box::new(tokio::io::stdin()),
    }
}

/// Identity of the file at a path (device, inode).
pub(super) fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    (m.dev(), m.ino())
}

/// Waits until `path` is a FIFO, then opens it read-write (so it never reports end-of-file)
/// and non-blocking. `None` on shutdown.
pub(super) async fn open_fifo(
    path: &Path,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<(BoxedInput, (u64, u64))>> {
    use std::os::unix::fs::FileTypeExt as _;
    let mut told = false;
    loop {
        match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_fifo() => {
                // O_RDWR on a FIFO does not block (Linux), and keeps a writer open ourselves.
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .with_context(|| format!("open the FIFO {}", path.display()))?;
                let id = file_id(&file.metadata().with_context(|| format!("stat {}", path.display()))?);
                let rx = tokio::net::unix::pipe::Receiver::from_file(file)
                    .with_context(|| format!("read the FIFO {}", path.display()))?;
                tracing::info!(fifo = %path.display(), "reading ofs.notify lines from the FIFO");
                return Ok(Some((Box::new(rx), id)));
            }
            Ok(_) => anyhow::bail!("{} is not a FIFO (ofs.notify … >PATH makes one)", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !told {
                    tracing::info!(fifo = %path.display(), "waiting for xrootd to create the FIFO");
                    told = true;
                }
            }
            Err(e) => return Err(e).with_context(|| format!("stat {}", path.display())),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(FIFO_CHECK) => {}
        }
    }
}
