//! Packet framing (spec sections 1 and 2): the 13-byte big-endian header, the
//! bare `0xDF` heartbeat byte, flags and command codes, with incremental decoding.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::FrameError;

/// Header length in bytes: length(4) cmd(1) cc(2) flags(1) sessionId(4) lrc(1).
pub const HEADER_LEN: usize = 13;
/// The single byte that is a whole heartbeat frame, in both directions.
pub const HEARTBEAT_BYTE: u8 = 0xDF;
/// mpush's `mp.core.max-packet-size` (10k): the largest body it accepts.
pub const DEFAULT_MAX_BODY: usize = 10 * 1024;

/// A command code. Unknown codes are kept as they are, so a newer peer's
/// packets pass through an older decoder instead of failing it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Command(pub u8);

impl Command {
    pub const HEARTBEAT: Self = Self(1);
    pub const HANDSHAKE: Self = Self(2);
    pub const LOGIN: Self = Self(3);
    pub const LOGOUT: Self = Self(4);
    pub const BIND: Self = Self(5);
    pub const UNBIND: Self = Self(6);
    pub const FAST_CONNECT: Self = Self(7);
    pub const PAUSE: Self = Self(8);
    pub const RESUME: Self = Self(9);
    pub const ERROR: Self = Self(10);
    pub const OK: Self = Self(11);
    pub const HTTP_PROXY: Self = Self(12);
    pub const KICK: Self = Self(13);
    pub const GATEWAY_KICK: Self = Self(14);
    pub const PUSH: Self = Self(15);
    pub const GATEWAY_PUSH: Self = Self(16);
    pub const NOTIFICATION: Self = Self(17);
    pub const GATEWAY_NOTIFICATION: Self = Self(18);
    pub const CHAT: Self = Self(19);
    pub const GATEWAY_CHAT: Self = Self(20);
    pub const GROUP: Self = Self(21);
    pub const GATEWAY_GROUP: Self = Self(22);
    pub const ACK: Self = Self(23);
    pub const NACK: Self = Self(24);
    /// v2 extension: the server asks the client to reconnect elsewhere.
    pub const REDIRECT: Self = Self(64);
    /// Cluster extension: one node asks another to deliver a push (node port only).
    pub const NODE_PUSH: Self = Self(65);
    /// Node to node: one message for many recipients (`v2::NodePushBatch`).
    pub const NODE_PUSH_BATCH: Self = Self(66);
    /// Java's `UNKNOWN(-1)`.
    pub const UNKNOWN: Self = Self(0xFF);

    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::HEARTBEAT => "HEARTBEAT",
            Self::HANDSHAKE => "HANDSHAKE",
            Self::LOGIN => "LOGIN",
            Self::LOGOUT => "LOGOUT",
            Self::BIND => "BIND",
            Self::UNBIND => "UNBIND",
            Self::FAST_CONNECT => "FAST_CONNECT",
            Self::PAUSE => "PAUSE",
            Self::RESUME => "RESUME",
            Self::ERROR => "ERROR",
            Self::OK => "OK",
            Self::HTTP_PROXY => "HTTP_PROXY",
            Self::KICK => "KICK",
            Self::GATEWAY_KICK => "GATEWAY_KICK",
            Self::PUSH => "PUSH",
            Self::GATEWAY_PUSH => "GATEWAY_PUSH",
            Self::NOTIFICATION => "NOTIFICATION",
            Self::GATEWAY_NOTIFICATION => "GATEWAY_NOTIFICATION",
            Self::CHAT => "CHAT",
            Self::GATEWAY_CHAT => "GATEWAY_CHAT",
            Self::GROUP => "GROUP",
            Self::GATEWAY_GROUP => "GATEWAY_GROUP",
            Self::ACK => "ACK",
            Self::NACK => "NACK",
            Self::REDIRECT => "REDIRECT",
            Self::NODE_PUSH => "NODE_PUSH",
            Self::NODE_PUSH_BATCH => "NODE_PUSH_BATCH",
            Self::UNKNOWN => "UNKNOWN",
            _ => return None,
        })
    }
}

/// The command's name (`BIND`), or `Command(99)` for one this crate does not know.
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Command({})", self.0),
        }
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The flag bits of spec section 1.4.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u8);

impl Flags {
    pub const NONE: Self = Self(0);
    pub const CRYPTO: Self = Self(0x01);
    pub const COMPRESS: Self = Self(0x02);
    pub const BIZ_ACK: Self = Self(0x04);
    pub const AUTO_ACK: Self = Self(0x08);
    pub const JSON_BODY: Self = Self(0x10);

    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    pub fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }
}

impl std::ops::BitOr for Flags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.with(rhs)
    }
}

impl std::fmt::Debug for Flags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flags({:#04x})", self.0)
    }
}

/// One framed packet. `cc` and `lrc` are carried but never computed or checked
/// (spec 1.3): senders write 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub cmd: Command,
    pub cc: i16,
    pub flags: Flags,
    pub session_id: i32,
    pub lrc: i8,
    pub body: Bytes,
}

impl Packet {
    pub fn new(cmd: Command, session_id: i32, flags: Flags, body: impl Into<Bytes>) -> Self {
        Self {
            cmd,
            cc: 0,
            flags,
            session_id,
            lrc: 0,
            body: body.into(),
        }
    }

    /// Encoded size on the wire.
    pub fn wire_len(&self) -> usize {
        HEADER_LEN + self.body.len()
    }
}

/// What a decoder cuts out of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Heartbeat,
    Packet(Packet),
}

impl Frame {
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Frame::Heartbeat => out.put_u8(HEARTBEAT_BYTE),
            Frame::Packet(p) => encode_packet(p, out),
        }
    }

    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.encode(&mut out);
        out.freeze()
    }
}

/// Writes one packet. A HEARTBEAT command always goes out as the bare byte, as
/// both Java encoders do.
pub fn encode_packet(p: &Packet, out: &mut BytesMut) {
    if p.cmd == Command::HEARTBEAT {
        out.put_u8(HEARTBEAT_BYTE);
        return;
    }
    out.reserve(p.wire_len());
    // Bodies are bounded by the sender's own limits, far below i32::MAX.
    out.put_i32(i32::try_from(p.body.len()).unwrap_or(i32::MAX));
    out.put_u8(p.cmd.0);
    out.put_i16(p.cc);
    out.put_u8(p.flags.0);
    out.put_i32(p.session_id);
    out.put_i8(p.lrc);
    out.put_slice(&p.body);
}

/// Incremental frame decoder with a configurable maximum body size.
#[derive(Debug, Clone, Copy)]
pub struct Decoder {
    max_body: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_BODY)
    }
}

impl Decoder {
    pub fn new(max_body: usize) -> Self {
        Self { max_body }
    }

    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// Cuts the next frame off the front of `buf`. `Ok(None)` means more bytes
    /// are needed (nothing is consumed). A negative or oversized length is an
    /// error as soon as the header is seen, before the body is buffered.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(&first) = buf.first() else {
            return Ok(None);
        };
        if first == HEARTBEAT_BYTE {
            buf.advance(1);
            return Ok(Some(Frame::Heartbeat));
        }
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let len = usize::try_from(len).map_err(|_| FrameError::NegativeLength(len))?;
        if len > self.max_body {
            return Err(FrameError::TooLarge {
                len,
                max: self.max_body,
            });
        }
        if buf.len() < HEADER_LEN + len {
            // A declared length is not an allocation: the buffer grows only
            // with what actually arrives.
            return Ok(None);
        }
        let mut head = buf.split_to(HEADER_LEN);
        head.advance(4);
        let cmd = Command(head.get_u8());
        let cc = head.get_i16();
        let flags = Flags(head.get_u8());
        let session_id = head.get_i32();
        let lrc = head.get_i8();
        let body = buf.split_to(len).freeze();
        if cmd == Command::HEARTBEAT {
            // A framed HEARTBEAT is still a heartbeat; encoders only ever send
            // the bare byte, so this keeps decode and encode consistent.
            return Ok(Some(Frame::Heartbeat));
        }
        Ok(Some(Frame::Packet(Packet {
            cmd,
            cc,
            flags,
            session_id,
            lrc,
            body,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind_packet() -> Packet {
        Packet::new(Command::BIND, 2, Flags::CRYPTO, vec![0xAB; 32])
    }

    #[test]
    fn incomplete_frames_wait_for_more_bytes() {
        let wire = Frame::Packet(bind_packet()).to_bytes();
        let d = Decoder::default();
        for cut in 0..wire.len() {
            let mut buf = BytesMut::from(&wire[..cut]);
            assert_eq!(d.decode(&mut buf), Ok(None), "cut at {cut}");
            assert_eq!(buf.len(), cut, "nothing consumed");
        }
        let mut buf = BytesMut::from(&wire[..]);
        assert_eq!(d.decode(&mut buf), Ok(Some(Frame::Packet(bind_packet()))));
        assert!(buf.is_empty());
    }

    #[test]
    fn heartbeats_and_packets_interleave() {
        let mut buf = BytesMut::new();
        buf.put_u8(HEARTBEAT_BYTE);
        buf.put_u8(HEARTBEAT_BYTE);
        Frame::Packet(bind_packet()).encode(&mut buf);
        buf.put_u8(HEARTBEAT_BYTE);
        let d = Decoder::default();
        assert_eq!(d.decode(&mut buf), Ok(Some(Frame::Heartbeat)));
        assert_eq!(d.decode(&mut buf), Ok(Some(Frame::Heartbeat)));
        assert!(matches!(d.decode(&mut buf), Ok(Some(Frame::Packet(_)))));
        assert_eq!(d.decode(&mut buf), Ok(Some(Frame::Heartbeat)));
        assert_eq!(d.decode(&mut buf), Ok(None));
    }

    #[test]
    fn negative_and_oversized_lengths_are_rejected_early() {
        let d = Decoder::new(100);
        let mut neg = BytesMut::from(&[0x80, 0, 0, 0][..]);
        assert_eq!(
            d.decode(&mut neg),
            Err(FrameError::NegativeLength(i32::MIN))
        );
        let mut big = BytesMut::from(&[0, 0, 0, 101][..]);
        assert_eq!(
            d.decode(&mut big),
            Err(FrameError::TooLarge { len: 101, max: 100 })
        );
    }

    #[test]
    fn unknown_commands_are_kept() {
        let p = Packet::new(Command(99), 7, Flags::NONE, Bytes::new());
        let mut buf = BytesMut::new();
        encode_packet(&p, &mut buf);
        let Ok(Some(Frame::Packet(back))) = Decoder::default().decode(&mut buf) else {
            panic!("decodes");
        };
        assert_eq!(back.cmd, Command(99));
        assert_eq!(format!("{:?}", back.cmd), "Command(99)");
    }

    /// Fuzz regression: a full-header packet with cmd HEARTBEAT decoded as a
    /// packet but re-encoded as the bare byte.
    #[test]
    fn framed_heartbeat_decodes_as_heartbeat() {
        let mut buf = BytesMut::from(&[0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7, 0x88][..]);
        assert_eq!(
            Decoder::default().decode(&mut buf),
            Ok(Some(Frame::Heartbeat))
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn heartbeat_command_encodes_as_one_byte() {
        let mut buf = BytesMut::new();
        encode_packet(
            &Packet::new(Command::HEARTBEAT, 5, Flags::NONE, Bytes::new()),
            &mut buf,
        );
        assert_eq!(&buf[..], &[HEARTBEAT_BYTE]);
    }
}
