//! The write side of a WebSocket connection: frames collected into one buffer per burst and
//! written with one syscall, the buffer freed once written.
//!
//! tungstenite's own write buffer is a `Vec` that keeps the capacity of the most it ever held,
//! for the life of the connection. Under faults that ratchets up (a resync's large
//! `depth_update`, a gap fill's burst) and stays: in the 10-minute soak ~4 MB over 2,000
//! connections after the first recovery (docs/soak.md). So the transport is told to write each
//! frame at once (`write_buffer_size(0)`; with pushes fragmented it then holds at most one
//! fragment), and this adapter under it does the batching: it appends what is written, writes
//! it out when [`LIMIT`] would be passed or at the flush that ends a burst, and then frees the
//! buffer. An idle connection holds no write buffer at all.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes collected before they are written out: 64 kline pushes (~250 B each) of one burst
/// go out in one `sendto`.
pub const LIMIT: usize = 16 * 1024;

/// An I/O stream whose writes are collected until a flush (or [`LIMIT`]).
pub struct WriteBatch<S> {
    inner: S,
    /// Collected bytes; no allocation between bursts.
    buf: Vec<u8>,
    /// How much of `buf` the socket has taken.
    written: usize,
}

impl<S> WriteBatch<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, buf: Vec::new(), written: 0 }
    }
}

impl<S: AsyncWrite + Unpin> WriteBatch<S> {
    /// Writes out everything collected, then frees the buffer.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf = Vec::new();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteBatch<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.buf.len() + data.len() > LIMIT {
            ready!(this.poll_write_out(cx))?;
        }
        if data.len() >= LIMIT {
            return Pin::new(&mut this.inner).poll_write(cx, data);
        }
        if this.buf.capacity() == 0 {
            this.buf.reserve_exact(LIMIT);
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteBatch<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test]
    async fn writes_wait_for_the_flush_or_the_limit_and_the_buffer_is_freed() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let mut batch = WriteBatch::new(near);
        let mut got = vec![0; 4 * LIMIT];
        let pending = |far: &mut tokio::io::DuplexStream, got: &mut [u8]| {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            match Pin::new(far).poll_read(&mut cx, &mut ReadBuf::new(got)) {
                Poll::Pending => true,
                Poll::Ready(r) => {
                    r.unwrap();
                    false
                }
            }
        };

        batch.write_all(b"one").await.unwrap();
        batch.write_all(b"two").await.unwrap();
        assert!(pending(&mut far, &mut got), "nothing is written before the flush");
        assert!(batch.buf.capacity() >= LIMIT);
        batch.flush().await.unwrap();
        assert_eq!(batch.buf.capacity(), 0, "the buffer is freed once written");
        let n = far.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"onetwo", "one write for the burst");

        // Past the limit, what was collected goes out first, in order.
        let chunk = vec![b'x'; LIMIT / 2 + 1];
        batch.write_all(&chunk).await.unwrap();
        batch.write_all(&chunk).await.unwrap();
        let n = far.read(&mut got).await.unwrap();
        assert_eq!(n, chunk.len(), "the first chunk went out when the second would pass the limit");
        batch.flush().await.unwrap();
        let n = far.read(&mut got).await.unwrap();
        assert_eq!(n, chunk.len());

        // A write as large as the limit goes straight through.
        batch.write_all(&vec![b'y'; LIMIT]).await.unwrap();
        assert_eq!(batch.buf.capacity(), 0);
        let n = far.read_exact(&mut got[..LIMIT]).await.unwrap();
        assert_eq!(n, LIMIT);
    }
}
