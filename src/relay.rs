//! A loopback TCP relay whose forwarding can be cut and mended: what the harnesses put
//! between one process and another to cut that one link and no other
//! ([`crate::procs::ProcStack`]'s EP and its scheduler).
//!
//! A cut is a partition, not a close: every connection stays open and nothing is forwarded
//! either way until [`Relay::mend`] (the bytes wait in the relay and the sockets' buffers, as
//! TCP's retransmissions would bridge a short partition); a connection accepted during a cut
//! reaches its target only once mended. So each end sees silence, never an error: what an
//! end does about silence (a lease, a keep-alive timeout) is what a cut tests. A target that
//! refuses closes the accepted connection at once (the dialler sees its peer gone).
//!
//! Must not know: what runs at either end, the stack.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Bytes read at once from one end.
const CHUNK: usize = 16 * 1024;

/// A relay on `127.0.0.1:<port>` to one target; stops (and drops every connection) when
/// dropped.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    /// `true` while forwarding, `false` while cut; every connection's pipes watch it.
    open: watch::Sender<bool>,
    /// Cancelled on drop: the accept loop and every connection end.
    stop: CancellationToken,
}

impl Relay {
    /// Listens on a free loopback port and forwards each connection to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (open, _) = watch::channel(true);
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, target, open.clone(), stop.clone()));
        Ok(Relay { addr, open, stop })
    }

    /// Where to dial instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Forwards nothing more, either way, until [`Relay::mend`].
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Forwards again, what waited first.
    pub fn mend(&self) {
        self.open.send_replace(true);
    }

    /// Whether it is cut.
    pub fn is_cut(&self) -> bool {
        !*self.open.borrow()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept(listener: TcpListener, target: SocketAddr, open: watch::Sender<bool>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((inbound, _)) => {
                let (open, stop) = (open.subscribe(), stop.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = connection(inbound, target, open) => {}
                    }
                });
            }
            Err(e) => {
                tracing::warn!("relay to {target}: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// One connection: dials the target once the relay is open, then pipes both ways until both
/// ends closed.
async fn connection(inbound: TcpStream, target: SocketAddr, mut open: watch::Receiver<bool>) {
    if open.wait_for(|o| *o).await.is_err() {
        return;
    }
    let outbound = match TcpStream::connect(target).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("relay to {target}: connect failed: {e}");
            return;
        }
    };
    let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    tokio::join!(pipe(in_read, out_write, open.clone()), pipe(out_read, in_write, open));
}

/// Copies `from` to `to` while open; when `from` ends, shuts `to` down so its peer sees the end.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut open: watch::Receiver<bool>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        if open.wait_for(|o| *o).await.is_err() {
            break;
        }
        // Reading from a `TcpStream` is cancel-safe: a cut that begins while waiting for bytes
        // loses none.
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = open.wait_for(|o| !*o) => continue,
        };
        if open.wait_for(|o| *o).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn read_some(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => Some(buf[..n].to_vec()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_cut_holds_bytes_without_closing_and_a_mend_delivers_them() {
        let relay = Relay::start(echo().await).await.expect("relay");
        let mut s = TcpStream::connect(relay.addr()).await.expect("connect");
        s.write_all(b"one").await.expect("write");
        assert_eq!(read_some(&mut s, Duration::from_secs(5)).await.as_deref(), Some(&b"one"[..]));

        relay.cut();
        assert!(relay.is_cut());
        s.write_all(b"two").await.expect("a cut link still takes bytes");
        assert_eq!(read_some(&mut s, Duration::from_millis(300)).await, None, "nothing crosses a cut");
        relay.mend();
        assert_eq!(read_some(&mut s, Duration::from_secs(5)).await.as_deref(), Some(&b"two"[..]), "held, then sent");
    }

    #[tokio::test]
    async fn a_connection_made_during_a_cut_reaches_its_target_once_mended() {
        let relay = Relay::start(echo().await).await.expect("relay");
        relay.cut();
        let mut s = TcpStream::connect(relay.addr()).await.expect("connect");
        s.write_all(b"hi").await.expect("write");
        assert_eq!(read_some(&mut s, Duration::from_millis(300)).await, None);
        relay.mend();
        assert_eq!(read_some(&mut s, Duration::from_secs(5)).await.as_deref(), Some(&b"hi"[..]));
    }

    #[tokio::test]
    async fn a_refusing_target_closes_the_accepted_connection() {
        let gone = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let target = gone.local_addr().expect("addr");
        drop(gone);
        let relay = Relay::start(target).await.expect("relay");
        let mut s = TcpStream::connect(relay.addr()).await.expect("connect");
        let mut buf = [0u8; 8];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("closed in time");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
}
