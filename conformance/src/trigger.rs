//! How the kit makes the server push: through this server's HTTP API, or
//! through mpush's own gateway protocol (`GATEWAY_PUSH` on the gateway
//! port, as the Java `PushSender` sends it: spec section 7.2), so the same
//! cases run against a Java mpush node.

use std::time::Duration;

use mpush_protocol::message::{Body, ErrorMessage, GatewayPush};
use mpush_protocol::packet::{Command, Decoder, Flags, Frame, Packet};
use mpush_protocol::session::AckMode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the server said about a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// Handed to a connection (the HTTP API's 200; the gateway's OK). The
    /// trace id, when the trigger has one.
    Delivered(Option<String>),
    /// No connection for the user (404 `offline`; ERROR code 1).
    Offline,
    /// Anything else, in words.
    Failed(String),
}

#[derive(Debug, Clone)]
pub enum Trigger {
    /// `base` is `http://host:port`; `token` a bearer token if the API wants one.
    Api { base: String, token: Option<String> },
    /// `host:port` of an mpush gateway (`mp.net.gateway-server-port`).
    Gateway { addr: String },
}

impl Trigger {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Api { .. } => "api",
            Self::Gateway { .. } => "gateway",
        }
    }

    /// Whether delivery states can be read back (the HTTP API's traces).
    pub fn has_traces(&self) -> bool {
        matches!(self, Self::Api { .. })
    }

    /// Pushes `content` to `user`. `client_type` is mpush's code of the
    /// devices meant (the gateway protocol addresses one type at a time).
    pub async fn push(
        &self,
        user: &str,
        content: &str,
        ack: AckMode,
        timeout: Duration,
        client_type: i32,
    ) -> Pushed {
        match self {
            Self::Api { base, token } => {
                let mode = match ack {
                    AckMode::None => "none",
                    AckMode::Auto => "auto",
                    AckMode::Biz => "biz",
                };
                let mut req = reqwest::Client::new()
                    .post(format!("{base}/api/v1/push"))
                    .timeout(Duration::from_secs(10))
                    .json(&json!({
                        "userId": user,
                        "content": content,
                        "ackMode": mode,
                        "timeoutMs": timeout.as_millis().max(100) as u64,
                    }));
                if let Some(t) = token {
                    req = req.bearer_auth(t);
                }
                match req.send().await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let body: serde_json::Value = r.json().await.unwrap_or_default();
                        match status {
                            200 => Pushed::Delivered(body["traceId"].as_str().map(str::to_owned)),
                            404 => Pushed::Offline,
                            s => Pushed::Failed(format!("HTTP {s}: {body}")),
                        }
                    }
                    Err(e) => Pushed::Failed(e.to_string()),
                }
            }
            Self::Gateway { addr } => {
                gateway_push(addr, user, content, ack, timeout, client_type).await
            }
        }
    }

    /// A trace's state for `user` (the HTTP API only).
    pub async fn trace_state(&self, trace_id: &str) -> Option<String> {
        let Self::Api { base, token } = self else {
            return None;
        };
        let mut req = reqwest::Client::new()
            .get(format!("{base}/api/v1/traces/{trace_id}"))
            .timeout(Duration::from_secs(5));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let v: serde_json::Value = req.send().await.ok()?.json().await.ok()?;
        v["recipients"][0]["state"]
            .as_str()
            .or(v["state"].as_str())
            .map(str::to_owned)
    }
}

async fn gateway_push(
    addr: &str,
    user: &str,
    content: &str,
    ack: AckMode,
    timeout: Duration,
    client_type: i32,
) -> Pushed {
    let Ok(Ok(mut s)) =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr)).await
    else {
        return Pushed::Failed(format!("cannot connect to the gateway {addr}"));
    };
    let flags = match ack {
        AckMode::None => Flags::NONE,
        AckMode::Auto => Flags::AUTO_ACK,
        AckMode::Biz => Flags::BIZ_ACK,
    };
    // mpush's PushSender: the gateway's timeout is the push's less 500 ms.
    let body = GatewayPush {
        user_id: user.into(),
        client_type,
        timeout: timeout.as_millis().saturating_sub(500).max(100) as i32,
        content: content.as_bytes().to_vec(),
        ..Default::default()
    };
    let id = 7;
    let frame = Frame::Packet(Packet::new(
        Command::GATEWAY_PUSH,
        id,
        flags,
        body.to_bytes(),
    ));
    if s.write_all(&frame.to_bytes()).await.is_err() {
        return Pushed::Failed("the gateway closed the connection".into());
    }
    let decoder = Decoder::new(1 << 20);
    let mut buf = bytes::BytesMut::new();
    let deadline = tokio::time::Instant::now() + timeout + Duration::from_secs(2);
    loop {
        if let Ok(Some(Frame::Packet(p))) = decoder.decode(&mut buf) {
            if p.session_id != id {
                continue;
            }
            return match p.cmd {
                Command::OK => Pushed::Delivered(None),
                Command::ERROR => match ErrorMessage::from_bytes(&p.body) {
                    Ok(e) if e.code.0 == 1 => Pushed::Offline,
                    Ok(e) => Pushed::Failed(format!("ERROR {}: {}", e.code.0, e.reason)),
                    Err(e) => Pushed::Failed(format!("an ERROR that does not decode: {e}")),
                },
                c => Pushed::Failed(format!("unexpected command {}", c.0)),
            };
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            Ok(_) => return Pushed::Failed("the gateway closed the connection".into()),
            // mpush answers nothing when an ACK times out (spec 11.13).
            Err(_) => return Pushed::Failed("no answer from the gateway".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The gateway trigger against spec 7.2 as a gateway sees it: the
    //! GATEWAY_PUSH it sends decodes to what was asked (flags, timeout less
    //! 500 ms, client type, content), and OK / ERROR 1 / ERROR 2 / silence
    //! read as delivered / offline / failed / failed. (No Java mpush node runs
    //! here; this pins the trigger's side of the wire.)
    use super::*;
    use tokio::net::TcpListener;

    /// A gateway that answers the first GATEWAY_PUSH with `reply` (or not at
    /// all) and hands back what it got.
    async fn gateway(reply: Option<Frame>) -> (String, tokio::task::JoinHandle<Packet>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.expect("accept");
            let decoder = Decoder::new(1 << 20);
            let mut buf = bytes::BytesMut::new();
            let p = loop {
                if let Ok(Some(Frame::Packet(p))) = decoder.decode(&mut buf) {
                    break p;
                }
                let mut chunk = [0u8; 4096];
                let n = s.read(&mut chunk).await.expect("read");
                assert!(n > 0, "the trigger closed before a whole packet");
                buf.extend_from_slice(&chunk[..n]);
            };
            if let Some(mut r) = reply {
                if let Frame::Packet(q) = &mut r {
                    q.session_id = p.session_id;
                }
                s.write_all(&r.to_bytes()).await.expect("write");
            }
            // Hold the socket until the trigger is done.
            let mut rest = [0u8; 16];
            let _ = s.read(&mut rest).await;
            p
        });
        (addr, task)
    }

    fn answer(cmd: Command, body: Vec<u8>) -> Frame {
        Frame::Packet(Packet::new(cmd, 0, Flags::NONE, body))
    }

    #[tokio::test]
    async fn the_gateway_trigger_speaks_push_sender_s_protocol() {
        use mpush_protocol::message::{ErrorCode, OkMessage};
        let ok = answer(
            Command::OK,
            OkMessage::new(Command::GATEWAY_PUSH, "").to_bytes(),
        );
        let (addr, got) = gateway(Some(ok)).await;
        let t = Trigger::Gateway { addr };
        let r = t
            .push("u1", "hi", AckMode::Biz, Duration::from_millis(3000), 1)
            .await;
        assert_eq!(r, Pushed::Delivered(None));
        let p = got.await.expect("join");
        assert_eq!((p.cmd, p.flags), (Command::GATEWAY_PUSH, Flags::BIZ_ACK));
        let body = GatewayPush::from_bytes(&p.body).expect("a GATEWAY_PUSH body");
        assert_eq!(
            (
                body.user_id.as_str(),
                body.client_type,
                body.timeout,
                &body.content[..]
            ),
            ("u1", 1, 2500, &b"hi"[..])
        );

        for (code, want) in [(1u8, Pushed::Offline), (2, Pushed::Failed(String::new()))] {
            let e = ErrorMessage::new(Command::GATEWAY_PUSH, ErrorCode(code));
            let (addr, _) = gateway(Some(answer(Command::ERROR, e.to_bytes()))).await;
            let r = Trigger::Gateway { addr }
                .push("u1", "hi", AckMode::None, Duration::from_millis(1000), 1)
                .await;
            match (r, want) {
                (Pushed::Offline, Pushed::Offline) => {}
                (Pushed::Failed(why), Pushed::Failed(_)) => {
                    assert!(why.contains("ERROR 2"), "{why}")
                }
                (r, w) => panic!("ERROR {code}: {r:?}, expected {w:?}"),
            }
        }
        // An ACK timeout: mpush answers nothing (spec 11.13).
        let (addr, _) = gateway(None).await;
        let r = Trigger::Gateway { addr }
            .push("u1", "hi", AckMode::Auto, Duration::from_millis(600), 1)
            .await;
        assert!(
            matches!(r, Pushed::Failed(ref w) if w.contains("no answer")),
            "{r:?}"
        );
    }
}
