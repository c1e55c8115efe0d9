//! The byte pipes a connection driver runs over: raw TCP, and WebSocket
//! (binary frames carry the same packets as TCP; text frames the legacy JSON).

use std::future::Future;
use std::io;

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// The room one read of a TCP or TLS socket may fill.
const READ_CHUNK: usize = 8192;

pub enum Incoming {
    Data(Bytes),
    Text(String),
    /// A control frame (ping or pong): the peer is alive.
    Activity,
    Eof,
}

pub trait Transport: Send + 'static {
    /// Which gateway this is.
    const KIND: crate::route::Transport;
    /// Cancel-safe: used in `select!`.
    fn recv(&mut self) -> impl Future<Output = io::Result<Incoming>> + Send;
    fn send(&mut self, data: Bytes) -> impl Future<Output = io::Result<()>> + Send;
    /// Writes what the socket takes now, without waiting: true when all of
    /// `data` went (what did not stays in `data` for `send`). The common
    /// path, with no future and no timer; the default takes nothing.
    fn try_send(&mut self, data: &mut Bytes) -> io::Result<bool> {
        let _ = data;
        Ok(false)
    }
    fn send_text(&mut self, text: String) -> impl Future<Output = io::Result<()>> + Send;
    /// A transport-level liveness probe (a WebSocket ping); TCP has none.
    fn ping(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send;
}

pub struct Tcp(pub TcpStream);

impl Transport for Tcp {
    const KIND: crate::route::Transport = crate::route::Transport::Tcp;

    async fn recv(&mut self) -> io::Result<Incoming> {
        // Polled readiness, not `readable().await`: the idle connection's task
        // then holds no 152-byte readiness future, only its waker in the
        // socket's registration. The buffer lives only inside one poll.
        // Read into the spare room of a fresh buffer (allocated once the
        // socket is ready): no 8 KiB stack buffer zeroed per read and no copy
        // out of it. Through tokio's own read, which takes a read shorter than
        // the buffer as the kernel's buffer drained and clears the socket's
        // readiness: the next `recv` waits for epoll instead of making a read
        // system call that finds nothing (one per message received).
        std::future::poll_fn(|cx| {
            std::task::ready!(self.0.poll_read_ready(cx))?;
            let mut buf = BytesMut::with_capacity(READ_CHUNK);
            let read = tokio_util::io::poll_read_buf(std::pin::Pin::new(&mut self.0), cx, &mut buf);
            std::task::Poll::Ready(match std::task::ready!(read) {
                Ok(0) => Ok(Incoming::Eof),
                Ok(_) => Ok(Incoming::Data(buf.freeze())),
                Err(e) => Err(e),
            })
        })
        .await
    }

    async fn send(&mut self, data: Bytes) -> io::Result<()> {
        self.0.write_all(&data).await
    }

    fn try_send(&mut self, data: &mut Bytes) -> io::Result<bool> {
        use bytes::Buf as _;
        while !data.is_empty() {
            match self.0.try_write(data) {
                Ok(0) => return Ok(false),
                Ok(n) => data.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    async fn send_text(&mut self, _text: String) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "text on a TCP connection",
        ))
    }

    async fn ping(&mut self) -> io::Result<()> {
        Ok(())
    }

    async fn shutdown(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

/// The binary gateway over TLS.
pub struct TlsTcp(pub Box<TlsStream<TcpStream>>);

impl Transport for TlsTcp {
    const KIND: crate::route::Transport = crate::route::Transport::Tcp;

    async fn recv(&mut self) -> io::Result<Incoming> {
        // rustls keeps its own buffers per connection; this one only lives
        // across the read (its spare room is read into, not zeroed first).
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        match self.0.read_buf(&mut buf).await? {
            0 => Ok(Incoming::Eof),
            _ => Ok(Incoming::Data(buf.freeze())),
        }
    }

    async fn send(&mut self, data: Bytes) -> io::Result<()> {
        self.0.write_all(&data).await?;
        self.0.flush().await
    }

    async fn send_text(&mut self, _text: String) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "text on a TCP connection",
        ))
    }

    async fn ping(&mut self) -> io::Result<()> {
        Ok(())
    }

    async fn shutdown(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

/// WebSocket over plain TCP or TLS (`wss://`).
pub struct Ws<S = TcpStream>(pub WebSocketStream<S>);

impl<S> Transport for Ws<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    const KIND: crate::route::Transport = crate::route::Transport::Ws;

    async fn recv(&mut self) -> io::Result<Incoming> {
        match self.0.next().await {
            None => Ok(Incoming::Eof),
            Some(Err(e)) => Err(io::Error::other(e)),
            Some(Ok(Message::Binary(b))) => Ok(Incoming::Data(b)),
            Some(Ok(Message::Text(t))) => Ok(Incoming::Text(t.as_str().to_owned())),
            Some(Ok(Message::Close(_))) => Ok(Incoming::Eof),
            // Pings are answered by tungstenite on the next write or flush.
            Some(Ok(_)) => {
                self.0.flush().await.map_err(io::Error::other)?;
                Ok(Incoming::Activity)
            }
        }
    }

    async fn send(&mut self, data: Bytes) -> io::Result<()> {
        self.0
            .send(Message::Binary(data))
            .await
            .map_err(io::Error::other)
    }

    async fn send_text(&mut self, text: String) -> io::Result<()> {
        self.0
            .send(Message::Text(text.into()))
            .await
            .map_err(io::Error::other)
    }

    async fn ping(&mut self) -> io::Result<()> {
        self.0
            .send(Message::Ping(Bytes::new()))
            .await
            .map_err(io::Error::other)
    }

    async fn shutdown(&mut self) {
        let _ = self.0.close(None).await;
    }
}
