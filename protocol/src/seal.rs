//! Turning message bodies into packets and back: compression, then sealing with
//! the connection's cipher, and the reverse, with the header bound into the
//! AEAD's associated data on the v2 profile.

use bytes::Bytes;

use crate::crypto::{Expanded, Rng, SessionCipher, compress_over, decompress};
use crate::error::ProtocolError;
use crate::packet::{Command, Flags, Packet};

/// Which end of a connection a packet was sealed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    fn peer(self) -> Self {
        match self {
            Self::Client => Self::Server,
            Self::Server => Self::Client,
        }
    }

    fn byte(self) -> u8 {
        match self {
            Self::Client => 1,
            Self::Server => 2,
        }
    }
}

/// The associated data of a v2 sealed body: cmd, flags, session id and the
/// direction, so a body cannot be moved to another packet, have its flags
/// changed, or be reflected back to the side that sealed it (both directions
/// share one key).
fn aad(cmd: Command, flags: Flags, session_id: i32, from: Side) -> [u8; 7] {
    let s = session_id.to_be_bytes();
    [cmd.0, flags.0, s[0], s[1], s[2], s[3], from.byte()]
}

/// How one side seals what it sends and opens what it receives.
#[derive(Debug)]
pub struct Sealer {
    /// The side this sealer seals for; it opens what the other side sealed.
    side: Side,
    cipher: Option<SessionCipher>,
    /// Compress bodies longer than this (1024 client, 10240 server in mpush).
    compress_over: usize,
    /// Largest body a compressed packet may inflate to.
    max_inflated: usize,
    /// GCM nonces for `seal_counted`: a random prefix and a counter (all
    /// zeros until `count_nonces`).
    nonces: ([u8; 4], u64),
    /// The cipher's key schedule while a burst of packets is sealed
    /// (`seal_counted` with `burst`), dropped (and wiped) by `cool`: an idle
    /// connection holds none (8 bytes for the empty box; the `Option` the
    /// nonces had took as much).
    held: Option<Box<Expanded>>,
}

impl Sealer {
    pub fn new(side: Side, compress_over: usize, max_inflated: usize) -> Self {
        Self {
            side,
            cipher: None,
            compress_over,
            max_inflated,
            nonces: ([0; 4], 0),
            held: None,
        }
    }

    /// From now on nothing is compressed: the peer does not inflate
    /// (`FEATURE_PLAIN_BODIES`).
    pub fn never_compress(&mut self) {
        self.compress_over = usize::MAX;
    }

    /// From now on `seal_counted` numbers its GCM nonces: `prefix` (random)
    /// then a 64-bit counter. Each connection's key is its own, so a nonce
    /// never repeats under a key, and no RNG has to be kept for it.
    pub fn count_nonces(&mut self, prefix: [u8; 4]) {
        self.nonces = (prefix, 0);
    }

    /// `seal`, with the next counted nonce (see `count_nonces`). With
    /// `burst` (another packet already waits for the same write), the key
    /// schedule expanded for it is kept for the next ones until `cool`:
    /// expanding it is a good part of sealing a short packet, and a burst
    /// (several pushes to one connection before its write) expands it once.
    pub fn seal_counted(
        &mut self,
        cmd: Command,
        session_id: i32,
        flags: Flags,
        body: &[u8],
        burst: bool,
    ) -> Packet {
        let (prefix, n) = &mut self.nonces;
        let mut nonce = [0u8; 12];
        nonce[..4].copy_from_slice(prefix);
        nonce[4..].copy_from_slice(&n.to_be_bytes());
        *n += 1;
        let mut held = self.held.take();
        let packet = self.seal_inner(
            cmd,
            session_id,
            flags,
            body,
            |c, aad, data| match &mut held {
                Some(e) => e.seal_with_nonce(nonce, aad, data),
                None if burst => held
                    .insert(Box::new(c.expand()))
                    .seal_with_nonce(nonce, aad, data),
                None => c.seal_with_nonce(nonce, aad, data),
            },
        );
        self.held = held;
        packet
    }

    /// The burst is over (its packets went to the transport): the key
    /// schedule `seal_counted` kept is dropped and wiped.
    pub fn cool(&mut self) {
        self.held = None;
    }

    pub fn cipher(&self) -> Option<&SessionCipher> {
        self.cipher.as_ref()
    }

    pub fn set_cipher(&mut self, cipher: Option<SessionCipher>) {
        self.cipher = cipher;
        self.held = None;
    }

    pub fn is_aead(&self) -> bool {
        self.cipher.as_ref().is_some_and(SessionCipher::is_aead)
    }

    /// A packet whose body is sent as it is.
    pub fn plain(cmd: Command, session_id: i32, flags: Flags, body: Vec<u8>) -> Packet {
        Packet::new(cmd, session_id, flags, body)
    }

    /// Compresses (over the threshold) and seals with the session cipher.
    pub fn seal(
        &self,
        rng: &mut Rng,
        cmd: Command,
        session_id: i32,
        flags: Flags,
        body: &[u8],
    ) -> Packet {
        self.seal_inner(cmd, session_id, flags, body, |c, aad, data| {
            c.seal(rng, aad, data)
        })
    }

    /// Compresses over the threshold, then seals with `seal` (given the
    /// cipher, the associated data and the body) when there is a cipher.
    fn seal_inner(
        &self,
        cmd: Command,
        session_id: i32,
        flags: Flags,
        body: &[u8],
        seal: impl FnOnce(&SessionCipher, &[u8], &[u8]) -> Vec<u8>,
    ) -> Packet {
        let mut flags = flags;
        let compressed = compress_over(body, self.compress_over);
        let mut data: &[u8] = body;
        if let Some(c) = &compressed {
            data = c;
            flags = flags.with(Flags::COMPRESS);
        }
        match &self.cipher {
            Some(c) => {
                let flags = flags.with(Flags::CRYPTO);
                let sealed = seal(c, &aad(cmd, flags, session_id, self.side), data);
                Packet::new(cmd, session_id, flags, sealed)
            }
            None => Packet::new(cmd, session_id, flags, data.to_vec()),
        }
    }

    /// Seals with an explicit cipher (HANDSHAKE_OK goes out under the client key).
    pub fn seal_with(
        &self,
        cipher: &SessionCipher,
        rng: &mut Rng,
        cmd: Command,
        session_id: i32,
        body: &[u8],
    ) -> Packet {
        let flags = Flags::CRYPTO;
        Packet::new(
            cmd,
            session_id,
            flags,
            cipher.seal(rng, &aad(cmd, flags, session_id, self.side), body),
        )
    }

    /// Opens a received body: decrypts when the crypto flag is set (with the
    /// session cipher, or `with` if given), then inflates when compressed.
    pub fn open(&self, packet: &Packet) -> Result<Bytes, ProtocolError> {
        self.open_with(self.cipher.as_ref(), packet)
    }

    pub fn open_with(
        &self,
        cipher: Option<&SessionCipher>,
        packet: &Packet,
    ) -> Result<Bytes, ProtocolError> {
        let mut body = packet.body.clone();
        if packet.flags.contains(Flags::CRYPTO) && !body.is_empty() {
            let c = cipher.ok_or(ProtocolError::State("encrypted packet before a key"))?;
            body = c
                .open(
                    &aad(
                        packet.cmd,
                        packet.flags,
                        packet.session_id,
                        self.side.peer(),
                    ),
                    &body,
                )?
                .into();
        }
        if packet.flags.contains(Flags::COMPRESS) && !body.is_empty() {
            body = decompress(&body, self.max_inflated)?.into();
        }
        Ok(body)
    }
}

#[cfg(all(test, feature = "classic"))]
mod tests {
    use super::*;
    use crate::crypto::AesKey;

    fn pair(gcm: bool) -> (Sealer, Sealer) {
        let key = AesKey([7; 16]);
        let cipher = if gcm {
            SessionCipher::gcm(&key)
        } else {
            SessionCipher::cbc(&key, [9; 16])
        };
        let mut server = Sealer::new(Side::Server, 10 * 1024, 1 << 20);
        let mut client = Sealer::new(Side::Client, 10 * 1024, 1 << 20);
        server.set_cipher(Some(cipher.clone()));
        client.set_cipher(Some(cipher));
        server.count_nonces([1, 2, 3, 4]);
        (server, client)
    }

    proptest::proptest! {
        /// A burst's packets, sealed with the key schedule kept from one to
        /// the next, are the bytes the same packets sealed one by one are
        /// (same key, same counted nonces), and the peer opens each; `cool`
        /// leaves no schedule behind.
        #[test]
        fn a_burst_seals_what_packets_one_by_one_do(
            gcm in proptest::bool::ANY,
            bodies in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 1..8),
        ) {
            let (mut alone, client) = pair(gcm);
            let (mut burst, _) = pair(gcm);
            for (i, body) in bodies.iter().enumerate() {
                let a = alone.seal_counted(Command::PUSH, i as i32, Flags::NONE, body, false);
                let b = burst.seal_counted(Command::PUSH, i as i32, Flags::NONE, body, i > 0);
                proptest::prop_assert_eq!(&a, &b);
                proptest::prop_assert_eq!(&client.open(&b).expect("opens")[..], &body[..]);
                proptest::prop_assert!(alone.held.is_none());
                proptest::prop_assert_eq!(burst.held.is_some(), i > 0);
            }
            burst.cool();
            proptest::prop_assert!(burst.held.is_none());
        }
    }

    /// A new key (a fast connect's, or the profile's "none") never seals
    /// with the schedule of the one before.
    #[test]
    fn a_new_cipher_drops_the_kept_schedule() {
        let (mut s, _) = pair(true);
        s.seal_counted(Command::PUSH, 1, Flags::NONE, b"one", false);
        s.seal_counted(Command::PUSH, 2, Flags::NONE, b"two", true);
        assert!(s.held.is_some());
        let (_, other) = pair(false);
        s.set_cipher(other.cipher.clone());
        assert!(s.held.is_none());
    }
}
