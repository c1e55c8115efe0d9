//! `server` mode: black-box cases against any mpush server at an address.
//! Each case names the section of the wire spec (`mpush-wire.md`) or the
//! ADR it checks. A case the server does not claim (the v2 profile on a
//! legacy server, a retransmit mpush 0.8.1 never makes) is "not offered";
//! one that needs a setting the run did not give is "skipped".

use std::sync::Arc;
use std::time::{Duration, Instant};

use mpush_protocol::client::{ClientConfig, ClientEvent};
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::message::{BindUser, Body};
use mpush_protocol::packet::{Command, Flags, Frame, HEARTBEAT_BYTE, Packet};
use mpush_protocol::session::{AckMode, DeviceInfo, Profile, ResumeTicket};

use crate::conn::{Conn, Seen, Target};
use crate::report::{Case, CaseResult, Outcome, run_cases};
use crate::trigger::{Pushed, Trigger};

/// What a run against a server needs.
#[derive(Debug, Clone)]
pub struct ServerKit {
    pub target: Target,
    /// The server's RSA public key (what its apps embed).
    pub public_key: Arc<RsaPublic>,
    pub trigger: Trigger,
    /// The server's fast-connect window, when it is short enough to wait
    /// out (the expired-session case runs only then).
    pub session_ttl: Option<Duration>,
    /// How long a connection that says nothing may stay open (mpush 0.8.1:
    /// about 40 s, spec 6.3).
    pub silence_limit: Duration,
    /// Makes device and user ids unique to this run.
    pub run_id: String,
}

/// Every server case: id, spec section, what it checks.
pub const CASES: &[Case] = &[
    (
        "framing.heartbeat",
        "mpush-wire 1.2",
        "a heartbeat byte is echoed",
    ),
    (
        "handshake.legacy",
        "mpush-wire 5.3",
        "the RSA handshake completes: session id, heartbeat, fast-connect ticket",
    ),
    (
        "handshake.v2",
        "ADR 0001",
        "the v2 profile, when offered, is negotiated",
    ),
    (
        "handshake.repeat",
        "mpush-wire 5.3, 11",
        "a second handshake on a connection is refused (ERROR 102) or closes it, never re-keys",
    ),
    (
        "fast_connect.resume",
        "mpush-wire 5.5",
        "a fresh ticket resumes the session without RSA",
    ),
    (
        "fast_connect.wrong_device",
        "mpush-wire 5.5",
        "a ticket from another device is refused (ERROR 7) and a handshake follows on the same socket",
    ),
    (
        "fast_connect.unknown_session",
        "mpush-wire 5.5",
        "an unknown session is refused (ERROR 7, 103) and a handshake follows",
    ),
    (
        "fast_connect.replayed",
        "ADR 0001",
        "a v2 ticket resumes once",
    ),
    (
        "fast_connect.expired",
        "mpush-wire 5.5",
        "a session past its expiry is refused",
    ),
    (
        "fast_connect.kept_binding",
        "ADR 0008",
        "a session that negotiated KEEP_BINDING resumes bound (ResumeAccept.bound): a push arrives with no BIND, twice over the ticket's rotation",
    ),
    (
        "fast_connect.kept_binding_unbound",
        "ADR 0008",
        "after UNBIND the next resume is not bound, and the user is offline",
    ),
    (
        "fast_connect.kept_binding_kicked",
        "ADR 0008",
        "a device kicked by a newer login resumes unbound, and the newer one keeps the user",
    ),
    ("bind.ok", "mpush-wire 6.4", "BIND answers OK(5)"),
    (
        "bind.duplicate_login_kick",
        "mpush-wire 7.4",
        "a second device of the same user and client type kicks the first",
    ),
    (
        "bind.unbind",
        "mpush-wire 6.4",
        "UNBIND answers OK(6) and the user is offline after it",
    ),
    (
        "push.no_ack",
        "mpush-wire 4, 7.2",
        "a push without ACK arrives",
    ),
    (
        "push.auto_ack",
        "mpush-wire 4, 9.5",
        "an AUTO_ACK push arrives and its ACK completes it",
    ),
    (
        "push.biz_ack",
        "mpush-wire 4, 9.5",
        "a BIZ_ACK push waits for the application's ACK",
    ),
    (
        "push.retry_unacked",
        "ADR 0007",
        "an unacknowledged push is sent again",
    ),
    (
        "push.ack_timeout",
        "mpush-wire 7.2, 11.13",
        "a push never acknowledged ends as a timeout",
    ),
    (
        "push.offline",
        "mpush-wire 7.2",
        "a push to a user with no connection is reported offline",
    ),
    (
        "errors.unsupported_command",
        "mpush-wire 2",
        "an unregistered command gets ERROR(cmd, 101) and the connection closes",
    ),
    (
        "errors.bind_before_handshake",
        "mpush-wire 6.4",
        "BIND before the handshake is refused and the connection closes",
    ),
    (
        "bounds.oversize_frame",
        "mpush-wire 1.5",
        "a frame header over the body limit closes the connection without waiting for the body",
    ),
    (
        "bounds.silence",
        "mpush-wire 6.3",
        "a connection that never speaks is closed",
    ),
    (
        "heartbeat.server_timeout",
        "mpush-wire 6.3",
        "a connection silent past its heartbeats is closed",
    ),
];

const WAIT: Duration = Duration::from_secs(5);

type CaseOutcome = Result<Outcome, String>;

fn pass() -> CaseOutcome {
    Ok(Outcome::Passed)
}

impl ServerKit {
    fn device(&self, case: &str, n: u32) -> DeviceInfo {
        DeviceInfo {
            device_id: format!("conf-{}-{case}-{n}", self.run_id),
            os_name: "android".into(),
            os_version: "13".into(),
            client_version: "0.8.1".into(),
        }
    }

    fn user(&self, case: &str) -> String {
        format!("conf-{}-{case}", self.run_id)
    }

    fn config(&self, device: DeviceInfo, v2: bool) -> ClientConfig {
        let mut c = ClientConfig::new(self.public_key.clone(), device);
        c.offer_v2 = v2;
        c
    }

    /// A connection whose handshake (or fast connect) completed.
    async fn connect(
        &self,
        device: DeviceInfo,
        v2: bool,
        ticket: Option<ResumeTicket>,
    ) -> Result<(Conn, ClientEvent), String> {
        let mut c = Conn::open(&self.target, self.config(device, v2), ticket)
            .await
            .map_err(|e| e.to_string())?;
        match c.handshake_end(WAIT).await {
            Some(e @ ClientEvent::Connected { .. }) => Ok((c, e)),
            Some(e) => Err(format!("the handshake ended in {e:?}")),
            None => Err(format!("no handshake answer within {WAIT:?}")),
        }
    }

    /// A connection bound to `user`.
    async fn bound(&self, device: DeviceInfo, user: &str, v2: bool) -> Result<Conn, String> {
        let (mut c, _) = self.connect(device, v2, None).await?;
        c.machine
            .bind(user, "", "", mpush_protocol::Instant::now())
            .map_err(|e| e.to_string())?;
        c.flush().await;
        match c
            .event(WAIT, |e| {
                matches!(e, ClientEvent::BindOk { .. } | ClientEvent::Closed { .. })
            })
            .await
        {
            Some(ClientEvent::BindOk { .. }) => Ok(c),
            other => Err(format!("BIND was not answered OK: {other:?}")),
        }
    }

    /// Runs every case (or those whose id starts with one of `only`).
    pub async fn run(&self, only: &[String]) -> Vec<CaseResult> {
        let budget = self.silence_limit.max(Duration::from_secs(30)) + Duration::from_secs(30);
        run_cases(CASES, "server", self.target.name(), only, budget, |id| {
            self.case(id)
        })
        .await
    }

    async fn case(&self, id: &str) -> CaseOutcome {
        match id {
            "framing.heartbeat" => self.heartbeat().await,
            "handshake.legacy" => self.handshake_legacy().await,
            "handshake.v2" => self.handshake_v2().await,
            "handshake.repeat" => self.handshake_repeat().await,
            "fast_connect.resume" => self.resume().await,
            "fast_connect.wrong_device" => self.resume_wrong_device().await,
            "fast_connect.unknown_session" => self.resume_unknown().await,
            "fast_connect.replayed" => self.resume_replayed().await,
            "fast_connect.expired" => self.resume_expired().await,
            "fast_connect.kept_binding" => self.kept_binding().await,
            "fast_connect.kept_binding_unbound" => self.kept_binding_unbound().await,
            "fast_connect.kept_binding_kicked" => self.kept_binding_kicked().await,
            "bind.ok" => self.bind_ok().await,
            "bind.duplicate_login_kick" => self.kick().await,
            "bind.unbind" => self.unbind().await,
            "push.no_ack" => self.push_mode(AckMode::None).await,
            "push.auto_ack" => self.push_mode(AckMode::Auto).await,
            "push.biz_ack" => self.push_mode(AckMode::Biz).await,
            "push.retry_unacked" => self.retry_unacked().await,
            "push.ack_timeout" => self.ack_timeout().await,
            "push.offline" => self.offline().await,
            "errors.unsupported_command" => self.unsupported().await,
            "errors.malformed_body" => self.malformed().await,
            "errors.bind_before_handshake" => self.bind_early().await,
            "bounds.oversize_frame" => self.oversize().await,
            "bounds.silence" => self.silence().await,
            "heartbeat.server_timeout" => self.heartbeat_timeout().await,
            other => Err(format!("no case {other}")),
        }
    }

    async fn heartbeat(&self) -> CaseOutcome {
        let (mut c, _) = self.connect(self.device("hb", 0), false, None).await?;
        let before = c.seen.iter().filter(|s| **s == Seen::Heartbeat).count();
        c.send_raw(&[HEARTBEAT_BYTE]).await;
        let mut n = 0;
        let deadline = tokio::time::Instant::now() + WAIT;
        while tokio::time::Instant::now() < deadline {
            c.settle(Duration::from_millis(100)).await;
            n = c.seen.iter().filter(|s| **s == Seen::Heartbeat).count() - before;
            if n > 0 || c.closed {
                break;
            }
        }
        if n == 0 {
            return Err("no heartbeat byte (0xDF) came back".into());
        }
        pass()
    }

    async fn handshake_legacy(&self) -> CaseOutcome {
        let (_, e) = self.connect(self.device("hs", 0), false, None).await?;
        let ClientEvent::Connected {
            profile,
            heartbeat,
            ticket,
            ..
        } = e
        else {
            unreachable!("connect returns Connected")
        };
        if profile != Profile::Legacy {
            return Err(format!("a legacy client got the {profile:?} profile"));
        }
        if heartbeat.is_zero() || heartbeat > Duration::from_secs(3600) {
            return Err(format!("negotiated heartbeat {heartbeat:?}"));
        }
        match ticket {
            Some(t) if !t.session_id.is_empty() => pass(),
            _ => Err("HandshakeOk carried no session id (no fast connect possible)".into()),
        }
    }

    async fn handshake_v2(&self) -> CaseOutcome {
        let (_, e) = self.connect(self.device("v2", 0), true, None).await?;
        match e {
            ClientEvent::Connected {
                profile: Profile::V2,
                ..
            } => pass(),
            _ => Ok(Outcome::NotOffered(
                "the server answered the v2 offer with the legacy profile".into(),
            )),
        }
    }

    async fn handshake_repeat(&self) -> CaseOutcome {
        let dev = self.device("repeat", 0);
        let (mut c, _) = self.connect(dev.clone(), false, None).await?;
        // A second client machine's handshake for the same device, as bytes.
        let mut fresh = mpush_protocol::client::ClientConnection::new(
            Arc::new(self.config(dev, false)),
            [9; 32],
            mpush_protocol::Instant::now(),
            crate::conn::unix_ms(),
            None,
            mpush_protocol::dedup::DedupWindow::default(),
        );
        let hello = fresh
            .poll_transmit()
            .ok_or("the machine made no handshake")?;
        let from = c.seen.len();
        c.send_raw(&hello).await;
        c.settle(Duration::from_secs(2)).await;
        let after = &c.seen[from..];
        if after.iter().any(
            |s| matches!(s, Seen::Packet { cmd, error: None, .. } if *cmd == Command::HANDSHAKE),
        ) {
            return Err("the server answered a second handshake with a HandshakeOk (re-keyed the connection)".into());
        }
        if after.iter().any(|s| {
            s.error_for(Command::HANDSHAKE)
                .is_some_and(|e| e.code.0 == 102)
        }) || c.closed
        {
            return pass();
        }
        Err(format!("neither ERROR(2, 102) nor a close; saw {after:?}"))
    }

    async fn resume(&self) -> CaseOutcome {
        let dev = self.device("resume", 0);
        let (_, e) = self.connect(dev.clone(), false, None).await?;
        let ClientEvent::Connected {
            ticket: Some(t), ..
        } = e
        else {
            return Err("no ticket from the handshake".into());
        };
        let (_, e) = self.connect(dev, false, Some(t)).await?;
        match e {
            ClientEvent::Connected { resumed: true, .. } => pass(),
            other => Err(format!("the fast connect did not resume: {other:?}")),
        }
    }

    /// A fast connect that must be refused, then a handshake on the same
    /// socket. `codes`: the ERROR codes the spec allows.
    async fn refused_resume(
        &self,
        dev: DeviceInfo,
        ticket: ResumeTicket,
        codes: &[u8],
    ) -> CaseOutcome {
        let mut c = Conn::open(&self.target, self.config(dev, false), Some(ticket))
            .await
            .map_err(|e| e.to_string())?;
        let e = c.handshake_end(WAIT).await;
        match e {
            Some(ClientEvent::Connected { resumed: true, .. }) => {
                return Err("the server resumed a session it must refuse".into());
            }
            Some(ClientEvent::Connected { resumed: false, .. }) => {}
            other => return Err(format!("no handshake after the refusal: {other:?}")),
        }
        let code = c
            .seen
            .iter()
            .find_map(|s| s.error_for(Command::FAST_CONNECT).map(|e| e.code.0));
        match code {
            Some(k) if codes.contains(&k) => pass(),
            Some(k) => Err(format!(
                "refused with ERROR(7, {k}); the spec has {codes:?}"
            )),
            None => Err("the refusal was not a plaintext ERROR(7)".into()),
        }
    }

    async fn resume_wrong_device(&self) -> CaseOutcome {
        let (_, e) = self
            .connect(self.device("wrongdev", 0), false, None)
            .await?;
        let ClientEvent::Connected {
            ticket: Some(t), ..
        } = e
        else {
            return Err("no ticket from the handshake".into());
        };
        self.refused_resume(self.device("wrongdev", 1), t, &[103, 104])
            .await
    }

    async fn resume_unknown(&self) -> CaseOutcome {
        let (_, e) = self.connect(self.device("unknown", 0), false, None).await?;
        let ClientEvent::Connected {
            ticket: Some(mut t),
            ..
        } = e
        else {
            return Err("no ticket from the handshake".into());
        };
        t.session_id = format!("{:032x}", crate::conn::unix_ms());
        self.refused_resume(self.device("unknown", 0), t, &[103])
            .await
    }

    async fn resume_replayed(&self) -> CaseOutcome {
        let dev = self.device("replay", 0);
        let (_, e) = self.connect(dev.clone(), true, None).await?;
        let ClientEvent::Connected {
            profile,
            ticket: Some(t),
            ..
        } = e
        else {
            return Err("no ticket from the handshake".into());
        };
        if profile != Profile::V2 {
            return Ok(Outcome::NotOffered(
                "legacy tickets are reusable by design (spec 5.5); v2 not offered".into(),
            ));
        }
        let (_, e) = self.connect(dev.clone(), true, Some(t.clone())).await?;
        if !matches!(e, ClientEvent::Connected { resumed: true, .. }) {
            return Err(format!("the first resume failed: {e:?}"));
        }
        let mut c = Conn::open(&self.target, self.config(dev, true), Some(t))
            .await
            .map_err(|e| e.to_string())?;
        match c.handshake_end(WAIT).await {
            Some(ClientEvent::Connected { resumed: true, .. }) => {
                Err("a used v2 ticket resumed a second time".into())
            }
            _ => pass(),
        }
    }

    async fn resume_expired(&self) -> CaseOutcome {
        let Some(ttl) = self.session_ttl else {
            return Ok(Outcome::Skipped(
                "needs --session-ttl-secs: the server's fast-connect window, short enough to wait"
                    .into(),
            ));
        };
        let dev = self.device("expired", 0);
        let (_, e) = self.connect(dev.clone(), false, None).await?;
        let ClientEvent::Connected {
            ticket: Some(mut t),
            ..
        } = e
        else {
            return Err("no ticket from the handshake".into());
        };
        tokio::time::sleep(ttl + Duration::from_secs(1)).await;
        // The client would drop an expired ticket itself: present it anyway,
        // as a clock-skewed client would.
        t.expire_at_ms = crate::conn::unix_ms() + 86_400_000;
        self.refused_resume(dev, t, &[103]).await
    }

    /// ADR 0008: a v2 connection that asked to keep its binding, bound to
    /// `user`, with its ticket; `Err(NotOffered)` when the server does not
    /// echo the bit.
    async fn keeping(
        &self,
        device: DeviceInfo,
        user: &str,
    ) -> Result<Result<(Conn, ResumeTicket), Outcome>, String> {
        let (mut c, e) = self.connect(device, true, None).await?;
        let ClientEvent::Connected {
            profile, ticket, ..
        } = e
        else {
            return Err(format!("not connected: {e:?}"));
        };
        if profile != Profile::V2 {
            return Ok(Err(Outcome::NotOffered("v2 not offered".into())));
        }
        if c.machine.server_features() & mpush_protocol::message::v2::FEATURE_KEEP_BINDING == 0 {
            return Ok(Err(Outcome::NotOffered(
                "the server does not echo KEEP_BINDING (it is optional)".into(),
            )));
        }
        let ticket = ticket.ok_or("no ticket from the handshake")?;
        c.machine
            .bind(user, "", "", mpush_protocol::Instant::now())
            .map_err(|e| e.to_string())?;
        c.flush().await;
        match c
            .event(WAIT, |e| {
                matches!(e, ClientEvent::BindOk { .. } | ClientEvent::Closed { .. })
            })
            .await
        {
            Some(ClientEvent::BindOk { .. }) => Ok(Ok((c, ticket))),
            other => Err(format!("BIND was not answered OK: {other:?}")),
        }
    }

    /// A fast connect with `ticket` that resumes: the connection and the
    /// next ticket.
    async fn resumed(
        &self,
        device: DeviceInfo,
        ticket: ResumeTicket,
    ) -> Result<(Conn, ResumeTicket), String> {
        let (c, e) = self.connect(device, true, Some(ticket)).await?;
        match e {
            ClientEvent::Connected {
                resumed: true,
                ticket: Some(next),
                ..
            } => Ok((c, next)),
            other => Err(format!("the fast connect did not resume: {other:?}")),
        }
    }

    async fn kept_binding(&self) -> CaseOutcome {
        let dev = self.device("kept", 0);
        let user = self.user("kept");
        let (c, mut ticket) = match self.keeping(dev.clone(), &user).await? {
            Ok(v) => v,
            Err(outcome) => return Ok(outcome),
        };
        drop(c);
        // Twice: the binding travels with each single-use ticket's rotation.
        for round in 0..2 {
            let (mut c, next) = self.resumed(dev.clone(), ticket).await?;
            if !c.machine.binding_kept() {
                return Err(format!(
                    "resume {round}: ResumeAccept.bound was not set, although the session negotiated KEEP_BINDING and was bound"
                ));
            }
            let text = format!("kept binding {round}");
            let (pushed, _) = self
                .push_to(&mut c, &user, &text, AckMode::None, WAIT)
                .await
                .map_err(|e| format!("resume {round}, no BIND sent: {e}"))?;
            if !matches!(pushed, Pushed::Delivered(_)) {
                return Err(format!("resume {round}: the trigger said {pushed:?}"));
            }
            ticket = next;
        }
        pass()
    }

    async fn kept_binding_unbound(&self) -> CaseOutcome {
        let dev = self.device("keptunbind", 0);
        let user = self.user("keptunbind");
        let (mut c, ticket) = match self.keeping(dev.clone(), &user).await? {
            Ok(v) => v,
            Err(outcome) => return Ok(outcome),
        };
        c.machine
            .unbind(&user, mpush_protocol::Instant::now())
            .map_err(|e| e.to_string())?;
        c.flush().await;
        if c.frame(
            WAIT,
            |s| matches!(s, Seen::Packet { cmd, .. } if *cmd == Command::OK),
        )
        .await
        .is_none()
        {
            return Err("UNBIND was not answered OK(6)".into());
        }
        drop(c);
        let (c, _) = self.resumed(dev, ticket).await?;
        if c.machine.binding_kept() {
            return Err("a session unbound before it was resumed came back bound".into());
        }
        match self
            .trigger
            .push(&user, "after unbind", AckMode::None, WAIT, 1)
            .await
        {
            Pushed::Offline => pass(),
            other => Err(format!(
                "a push after UNBIND and a resume: {other:?}, not offline"
            )),
        }
    }

    async fn kept_binding_kicked(&self) -> CaseOutcome {
        let user = self.user("keptkick");
        let (old, newer) = (self.device("keptkick", 0), self.device("keptkick", 1));
        let (mut first, ticket) = match self.keeping(old.clone(), &user).await? {
            Ok(v) => v,
            Err(outcome) => return Ok(outcome),
        };
        let (mut second, _) = match self.keeping(newer, &user).await? {
            Ok(v) => v,
            Err(outcome) => return Ok(outcome),
        };
        if first
            .event(WAIT, |e| matches!(e, ClientEvent::Kicked { .. }))
            .await
            .is_none()
        {
            return Err("the first device got no KICK".into());
        }
        drop(first);
        // The kicked device comes back with its ticket: it may resume (or be
        // refused and handshake), but not as the user (no ping-pong between
        // the two devices).
        let (again, _) = self.connect(old, true, Some(ticket)).await?;
        if again.machine.binding_kept() {
            return Err("a device kicked by a newer login came back bound to the user".into());
        }
        let (pushed, _) = self
            .push_to(
                &mut second,
                &user,
                "to the newer device",
                AckMode::None,
                WAIT,
            )
            .await
            .map_err(|e| format!("the newer device after the old one resumed: {e}"))?;
        match pushed {
            Pushed::Delivered(_) => pass(),
            other => Err(format!("the trigger said {other:?}")),
        }
    }

    async fn bind_ok(&self) -> CaseOutcome {
        self.bound(self.device("bind", 0), &self.user("bind"), false)
            .await?;
        pass()
    }

    async fn kick(&self) -> CaseOutcome {
        let user = self.user("kick");
        let mut first = self.bound(self.device("kick", 0), &user, false).await?;
        let _second = self.bound(self.device("kick", 1), &user, false).await?;
        match first
            .event(WAIT, |e| matches!(e, ClientEvent::Kicked { .. }))
            .await
        {
            Some(_) => pass(),
            None => Err("the first device got no KICK".into()),
        }
    }

    async fn unbind(&self) -> CaseOutcome {
        let user = self.user("unbind");
        let mut c = self.bound(self.device("unbind", 0), &user, false).await?;
        c.machine
            .unbind(&user, mpush_protocol::Instant::now())
            .map_err(|e| e.to_string())?;
        c.flush().await;
        let ok = c
            .frame(
                WAIT,
                |s| matches!(s, Seen::Packet { cmd, .. } if *cmd == Command::OK),
            )
            .await;
        if ok.is_none() {
            return Err("UNBIND was not answered OK(6)".into());
        }
        match self
            .trigger
            .push(&user, "after unbind", AckMode::None, WAIT, 1)
            .await
        {
            Pushed::Offline => pass(),
            other => Err(format!("a push after UNBIND: {other:?}, not offline")),
        }
    }

    /// Pushes and waits for the message; returns it.
    async fn push_to(
        &self,
        c: &mut Conn,
        user: &str,
        text: &str,
        mode: AckMode,
        timeout: Duration,
    ) -> Result<(Pushed, mpush_protocol::client::IncomingPush), String> {
        let trigger = self.trigger.clone();
        let (user, t) = (user.to_owned(), text.to_owned());
        let push = tokio::spawn(async move { trigger.push(&user, &t, mode, timeout, 1).await });
        let text = text.as_bytes().to_vec();
        let got = c
            .event(
                WAIT,
                |e| matches!(e, ClientEvent::Message(m) if m.content[..] == text[..]),
            )
            .await;
        let pushed = push.await.map_err(|e| e.to_string())?;
        match got {
            Some(ClientEvent::Message(m)) => Ok((pushed, m)),
            _ => Err(format!("the push did not arrive ({pushed:?})")),
        }
    }

    async fn push_mode(&self, mode: AckMode) -> CaseOutcome {
        let name = format!("push-{mode:?}").to_lowercase();
        let user = self.user(&name);
        let mut c = self.bound(self.device(&name, 0), &user, false).await?;
        let (pushed, m) = self
            .push_to(&mut c, &user, "conformance", mode, WAIT)
            .await?;
        if m.ack_mode != mode {
            return Err(format!("arrived as {:?}, sent as {mode:?}", m.ack_mode));
        }
        if mode == AckMode::Biz {
            let token = m.ack.ok_or("a BIZ push without an ACK token")?;
            c.machine
                .ack(token, mpush_protocol::Instant::now())
                .map_err(|e| e.to_string())?;
            c.flush().await;
        }
        match (&pushed, mode) {
            (Pushed::Delivered(trace), AckMode::Auto | AckMode::Biz)
                if self.trigger.has_traces() =>
            {
                let trace = trace.clone().ok_or("no trace id in the answer")?;
                let deadline = Instant::now() + WAIT;
                loop {
                    let s = self.trigger.trace_state(&trace).await;
                    if s.as_deref() == Some("ACK") {
                        return pass();
                    }
                    if Instant::now() > deadline {
                        return Err(format!("the ACK did not complete the push (state {s:?})"));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            (Pushed::Delivered(_), _) => pass(),
            (other, _) => Err(format!("the trigger said {other:?}")),
        }
    }

    async fn retry_unacked(&self) -> CaseOutcome {
        let user = self.user("retry");
        let mut c = self.bound(self.device("retry", 0), &user, false).await?;
        let (_, first) = self
            .push_to(
                &mut c,
                &user,
                "retry me",
                AckMode::Biz,
                Duration::from_millis(1000),
            )
            .await?;
        let again = c
            .frame(
                Duration::from_secs(8),
                |s| matches!(s, Seen::Packet { cmd, .. } if *cmd == Command::PUSH),
            )
            .await;
        if let Some(t) = first.ack {
            let _ = c.machine.ack(t, mpush_protocol::Instant::now());
            c.flush().await;
        }
        match again {
            Some(_) => pass(),
            None => Ok(Outcome::NotOffered(
                "no retransmit within 8 s (mpush 0.8.1 does not retry)".into(),
            )),
        }
    }

    async fn ack_timeout(&self) -> CaseOutcome {
        let user = self.user("acktimeout");
        let mut c = self
            .bound(self.device("acktimeout", 0), &user, false)
            .await?;
        let (pushed, _) = self
            .push_to(
                &mut c,
                &user,
                "never acked",
                AckMode::Biz,
                Duration::from_millis(500),
            )
            .await?;
        match pushed {
            Pushed::Delivered(Some(trace)) if self.trigger.has_traces() => {
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    // Keep the connection read (retries arrive) but never ACK.
                    c.settle(Duration::from_millis(200)).await;
                    let s = self.trigger.trace_state(&trace).await;
                    if s.as_deref() == Some("TIMEOUT") {
                        return pass();
                    }
                    if Instant::now() > deadline {
                        return Err(format!("no TIMEOUT within 30 s (state {s:?})"));
                    }
                }
            }
            // mpush's gateway answers nothing when the ACK times out (11.13).
            Pushed::Failed(why) if why.contains("no answer") => pass(),
            other => Err(format!("the trigger said {other:?}")),
        }
    }

    async fn offline(&self) -> CaseOutcome {
        match self
            .trigger
            .push(&self.user("nobody"), "to nobody", AckMode::None, WAIT, 1)
            .await
        {
            Pushed::Offline => pass(),
            other => Err(format!("{other:?}")),
        }
    }

    async fn unsupported(&self) -> CaseOutcome {
        let (mut c, _) = self
            .connect(self.device("unsupported", 0), false, None)
            .await?;
        let frame = Frame::Packet(Packet::new(Command::LOGIN, 77, Flags::NONE, Vec::new()));
        c.send_raw(&frame.to_bytes()).await;
        let err = c
            .frame(WAIT, |s| s.error_for(Command::LOGIN).is_some())
            .await;
        let closed = c.closed_within(WAIT).await;
        match (
            err.as_ref().and_then(|s| s.error_for(Command::LOGIN)),
            closed,
        ) {
            (Some(e), _) if e.code.0 != 101 => Err(format!("ERROR code {}, not 101", e.code.0)),
            (Some(_), true) => pass(),
            (Some(_), false) => Err("ERROR 101 but the connection stayed open".into()),
            (None, _) => Err("no ERROR(3, 101) for an unregistered command".into()),
        }
    }

    async fn malformed(&self) -> CaseOutcome {
        let (mut c, _) = self
            .connect(self.device("malformed", 0), false, None)
            .await?;
        // A BIND whose "encrypted" body is noise (not a whole AES block).
        let frame = Frame::Packet(Packet::new(Command::BIND, 5, Flags::CRYPTO, vec![0x5A; 21]));
        c.send_raw(&frame.to_bytes()).await;
        if !c.closed_within(WAIT).await {
            return Err("the connection stayed open after a body that does not decrypt".into());
        }
        if let Some(e) = c.seen.iter().find_map(|s| match s {
            Seen::Packet { error: Some(e), .. } if e.code.0 != 100 => Some(e.clone()),
            _ => None,
        }) {
            return Err(format!("ERROR code {} (mpush: 100)", e.code.0));
        }
        // The server still serves.
        self.connect(self.device("malformed", 1), false, None)
            .await?;
        pass()
    }

    async fn bind_early(&self) -> CaseOutcome {
        let mut c = Conn::open_raw(&self.target, self.config(self.device("early", 0), false))
            .await
            .map_err(|e| e.to_string())?;
        let body = BindUser {
            user_id: self.user("early"),
            ..Default::default()
        };
        let frame = Frame::Packet(Packet::new(Command::BIND, 3, Flags::NONE, body.to_bytes()));
        c.send_raw(&frame.to_bytes()).await;
        if c.closed_within(WAIT).await {
            pass()
        } else {
            Err("the connection stayed open after a BIND before the handshake".into())
        }
    }

    async fn oversize(&self) -> CaseOutcome {
        let (mut c, _) = self
            .connect(self.device("oversize", 0), false, None)
            .await?;
        // A header announcing 8 MiB, and then nothing.
        let mut header = vec![0u8; 13];
        header[..4].copy_from_slice(&(8i32 << 20).to_be_bytes());
        header[4] = Command::PUSH.0;
        c.send_raw(&header).await;
        if c.closed_within(WAIT).await {
            pass()
        } else {
            Err(
                "the server waits for an 8 MiB body over its limit (mpush 0.8.1 does: spec 1.5)"
                    .into(),
            )
        }
    }

    async fn silence(&self) -> CaseOutcome {
        let mut c = Conn::open_raw(&self.target, self.config(self.device("silent", 0), false))
            .await
            .map_err(|e| e.to_string())?;
        if c.closed_within(self.silence_limit).await {
            pass()
        } else {
            Err(format!(
                "a silent connection was still open after {:?}",
                self.silence_limit
            ))
        }
    }

    async fn heartbeat_timeout(&self) -> CaseOutcome {
        let mut cfg = self.config(self.device("hbtimeout", 0), false);
        cfg.min_heartbeat = Duration::from_millis(1000);
        cfg.max_heartbeat = Duration::from_millis(1000);
        let mut c = Conn::open(&self.target, cfg, None)
            .await
            .map_err(|e| e.to_string())?;
        let Some(ClientEvent::Connected { heartbeat, .. }) = c
            .event(WAIT, |e| matches!(e, ClientEvent::Connected { .. }))
            .await
        else {
            return Err("no handshake".into());
        };
        if heartbeat > Duration::from_secs(5) {
            return Ok(Outcome::Skipped(format!(
                "negotiated heartbeat {heartbeat:?}: too long to wait (a server with a short min heartbeat runs it)"
            )));
        }
        // Say nothing more: the kit's machine would send heartbeats, so the
        // socket is read without feeding its timer.
        let within = heartbeat * 4 + Duration::from_secs(2);
        let deadline = tokio::time::Instant::now() + within;
        let closed = c.silent_until(deadline).await;
        match (closed, &self.target) {
            (true, _) => pass(),
            // mpush checks heartbeats on its TCP connect server only (6.3).
            (false, Target::Ws(_)) => Ok(Outcome::NotOffered(
                "no heartbeat check on WebSocket (mpush has none there: spec 6.3)".into(),
            )),
            (false, Target::Tcp(_)) => Err(format!(
                "still open {within:?} after the last frame (heartbeat {heartbeat:?})"
            )),
        }
    }
}
