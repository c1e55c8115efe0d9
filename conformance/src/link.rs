//! One socket of the kit, either side: TCP bytes, or the same bytes in
//! binary WebSocket messages. Reading yields what arrived (`None`: the peer
//! is gone); writing reports whether the socket took it.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// `S` is the stream under the WebSocket: a client's may be TLS, the
/// scripted server's is plain TCP.
pub enum Link<S> {
    Tcp(TcpStream),
    Ws(Box<WebSocketStream<S>>),
}

impl<S: AsyncRead + AsyncWrite + Unpin> Link<S> {
    /// The next bytes (a binary message, on WebSocket), or `None` when the
    /// peer closed or failed. Cancel-safe as far as the kit needs (it is
    /// raced against timers in `select!`).
    pub async fn read(&mut self, buf: &mut [u8]) -> Option<Vec<u8>> {
        match self {
            Self::Tcp(s) => match s.read(buf).await {
                Ok(0) | Err(_) => None,
                Ok(n) => Some(buf[..n].to_vec()),
            },
            Self::Ws(ws) => loop {
                match ws.next().await {
                    Some(Ok(Message::Binary(b))) => break Some(b.to_vec()),
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break None,
                    Some(Ok(_)) => continue,
                }
            },
        }
    }

    /// Writes `bytes` whole (one binary message on WebSocket); false when
    /// the socket is gone.
    pub async fn write(&mut self, bytes: &[u8]) -> bool {
        match self {
            Self::Tcp(s) => s.write_all(bytes).await.is_ok(),
            Self::Ws(ws) => ws
                .send(Message::Binary(bytes.to_vec().into()))
                .await
                .is_ok(),
        }
    }
}
