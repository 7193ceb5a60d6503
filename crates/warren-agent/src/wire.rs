//! The agent's network transport: how warren and an agent that is not on its host (a pod)
//! talk over TCP.
//!
//! On a Unix socket the kernel vouches for the peer (only the provisioner reaches the
//! socket) and the command's stdio passes as descriptors. Over TCP neither holds, so:
//!
//! - **Every connection is authenticated both ways** with the sandbox's agent key (32
//!   bytes known only to warren and the agent: never in a file, never in a command's
//!   environment, and the agent is non-dumpable). The agent speaks first with a fresh
//!   nonce; warren answers with a nonce of its own and a proof over both, the agent
//!   answers with its own proof. A recorded handshake is worthless: the next one has
//!   another nonce of the agent's.
//! - **Every frame after it is sealed** (ChaCha20-Poly1305) under keys derived from the
//!   agent key and both nonces, one per direction, with a counter as the nonce: a frame
//!   that is altered, dropped, reordered, replayed or moved into another connection fails
//!   to open and ends the connection.
//! - **stdin, stdout and stderr travel as frames** beside the control protocol's JSON
//!   messages ([`Kind`]).
//!
//! ```text
//! agent → warren   MAGIC ‖ agent nonce
//! warren → agent   MAGIC ‖ warren nonce ‖ keyed_hash(key, CLIENT ‖ agent nonce ‖ warren nonce)
//! agent → warren   keyed_hash(key, AGENT ‖ agent nonce ‖ warren nonce)
//! then, each way   u32 length ‖ ChaCha20-Poly1305(kind ‖ payload)
//! ```

use std::io::{self, Read, Write};

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};

use crate::protocol::MAX_FRAME;

/// The environment variable the agent reads its key from (hex), once, at start; it removes
/// it before anything else runs.
pub const AGENT_KEY_ENV: &str = "WARREN_AGENT_KEY";

/// What both sides send first: the protocol and its version.
const MAGIC: &[u8; 8] = b"WRNAGT01";
const NONCE: usize = 32;
const PROOF: usize = 32;
/// Poly1305's tag.
const TAG: usize = 16;
/// Largest sealed frame: a whole control message (argv and environment) plus its kind.
pub const MAX_SEALED: usize = MAX_FRAME + 1 + TAG;
/// Largest piece of output or input in one frame.
pub const DATA_CHUNK: usize = 64 * 1024;

/// A sandbox's agent key.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentKey([u8; 32]);

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKey(..)")
    }
}

impl AgentKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A fresh random key.
    pub fn generate() -> io::Result<Self> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(io::Error::other)?;
        Ok(Self(bytes))
    }

    /// The key of one runtime derived from a secret of warren's: the same on every replica
    /// that holds the secret, different for every sandbox and generation, and telling
    /// nothing about the secret or another runtime's key.
    pub fn derive(secret: &[u8], sandbox: &str, generation: i64) -> Self {
        let mut material = Vec::with_capacity(secret.len() + sandbox.len() + 24);
        for part in [secret, sandbox.as_bytes()] {
            material.extend_from_slice(&(part.len() as u64).to_le_bytes());
            material.extend_from_slice(part);
        }
        material.extend_from_slice(&generation.to_le_bytes());
        Self(blake3::derive_key(
            "warren 2026 agent key of one runtime",
            &material,
        ))
    }

    /// The key as 64 hex digits (what [`AGENT_KEY_ENV`] holds).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.len() != 64 || !text.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(bytes))
    }

    fn proof(&self, role: &str, agent: &[u8; NONCE], warren: &[u8; NONCE]) -> blake3::Hash {
        let mut hasher = blake3::Hasher::new_keyed(&self.0);
        hasher.update(role.as_bytes());
        hasher.update(agent);
        hasher.update(warren);
        hasher.finalize()
    }

    fn direction(&self, label: &str, agent: &[u8; NONCE], warren: &[u8; NONCE]) -> Sealing {
        let mut material = Vec::with_capacity(32 + 2 * NONCE);
        material.extend_from_slice(&self.0);
        material.extend_from_slice(agent);
        material.extend_from_slice(warren);
        let key = blake3::derive_key(label, &material);
        Sealing {
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
            counter: 0,
        }
    }

    /// The two directions' sealing of one connection: (warren → agent, agent → warren).
    fn sessions(&self, agent: &[u8; NONCE], warren: &[u8; NONCE]) -> (Sealing, Sealing) {
        (
            self.direction("warren 2026 agent wire warren to agent", agent, warren),
            self.direction("warren 2026 agent wire agent to warren", agent, warren),
        )
    }
}

const CLIENT_PROOF: &str = "warren proves it holds the agent key";
const AGENT_PROOF: &str = "the agent proves it holds the agent key";

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A [`crate::protocol::Request`] as JSON (warren → agent).
    Request = 1,
    /// A [`crate::protocol::Reply`] as JSON (agent → warren).
    Reply = 2,
    /// Bytes for the command's stdin.
    Stdin = 3,
    /// The command's stdin ends.
    StdinEnd = 4,
    /// Bytes the command wrote to stdout.
    Stdout = 5,
    /// Bytes the command wrote to stderr.
    Stderr = 6,
    /// A piece of a home's tar stream.
    Data = 7,
    /// The tar stream ends.
    DataEnd = 8,
    /// One stdin frame was written to the command's stdin (agent → warren): one more may
    /// be sent (see `Reply::Started::stdin_window`).
    StdinAck = 9,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => Self::Request,
            2 => Self::Reply,
            3 => Self::Stdin,
            4 => Self::StdinEnd,
            5 => Self::Stdout,
            6 => Self::Stderr,
            7 => Self::Data,
            8 => Self::DataEnd,
            9 => Self::StdinAck,
            _ => return None,
        })
    }
}

/// One direction's cipher and frame counter.
struct Sealing {
    cipher: ChaCha20Poly1305,
    counter: u64,
}

impl Sealing {
    fn nonce(&mut self) -> io::Result<[u8; 12]> {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&self.counter.to_le_bytes());
        self.counter = self
            .counter
            .checked_add(1)
            .ok_or_else(|| invalid("the connection ran out of frame numbers"))?;
        Ok(nonce)
    }
}

/// Seals frames for one direction of a connection.
pub struct Sealer(Sealing);

impl Sealer {
    /// The whole frame to write: length, then the sealed kind and payload.
    pub fn seal(&mut self, kind: Kind, payload: &[u8]) -> io::Result<Vec<u8>> {
        if payload.len() > MAX_FRAME {
            return Err(invalid("a frame larger than the protocol allows"));
        }
        let mut plain = Vec::with_capacity(payload.len() + 1);
        plain.push(kind as u8);
        plain.extend_from_slice(payload);
        let nonce = self.0.nonce()?;
        let sealed = self
            .0
            .cipher
            .encrypt(Nonce::from_slice(&nonce), plain.as_slice())
            .map_err(|_| invalid("sealing failed"))?;
        let mut frame = Vec::with_capacity(sealed.len() + 4);
        frame.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
        frame.extend_from_slice(&sealed);
        Ok(frame)
    }
}

/// Opens frames of one direction of a connection.
pub struct Opener(Sealing);

impl Opener {
    /// Checks a frame's length header before its body is read: an oversized one ends the
    /// connection before anything is allocated for it.
    pub fn check_length(header: [u8; 4]) -> io::Result<usize> {
        let len = u32::from_le_bytes(header) as usize;
        if !(TAG + 1..=MAX_SEALED).contains(&len) {
            return Err(invalid(format!(
                "a frame of {len} bytes (at most {MAX_SEALED})"
            )));
        }
        Ok(len)
    }

    /// Opens one sealed body: its kind and payload.
    pub fn open(&mut self, sealed: &[u8]) -> io::Result<(Kind, Vec<u8>)> {
        let nonce = self.0.nonce()?;
        let mut plain = self
            .0
            .cipher
            .decrypt(Nonce::from_slice(&nonce), sealed)
            .map_err(|_| invalid("a frame failed authentication"))?;
        let kind = Kind::from_byte(plain[0]).ok_or_else(|| invalid("a frame of no known kind"))?;
        plain.remove(0);
        Ok((kind, plain))
    }
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

fn random_nonce() -> io::Result<[u8; NONCE]> {
    let mut nonce = [0u8; NONCE];
    getrandom::fill(&mut nonce).map_err(io::Error::other)?;
    Ok(nonce)
}

/// The agent's side of the handshake, blocking: the peer is warren only if it proves it
/// holds `key`. Returns the agent's sealer (agent → warren) and opener (warren → agent).
pub fn accept<S: Read + Write>(stream: &mut S, key: &AgentKey) -> io::Result<(Sealer, Opener)> {
    let agent = random_nonce()?;
    let mut hello = Vec::with_capacity(MAGIC.len() + NONCE);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&agent);
    stream.write_all(&hello)?;
    let mut answer = [0u8; 8 + NONCE + PROOF];
    stream.read_exact(&mut answer)?;
    if &answer[..8] != MAGIC {
        return Err(invalid("not warren's agent protocol"));
    }
    let warren: [u8; NONCE] = answer[8..8 + NONCE].try_into().expect("sized");
    let proof: [u8; PROOF] = answer[8 + NONCE..].try_into().expect("sized");
    // `blake3::Hash`'s equality is constant-time.
    if key.proof(CLIENT_PROOF, &agent, &warren) != blake3::Hash::from_bytes(proof) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the peer does not hold the agent key",
        ));
    }
    stream.write_all(key.proof(AGENT_PROOF, &agent, &warren).as_bytes())?;
    stream.flush()?;
    let (to_agent, to_warren) = key.sessions(&agent, &warren);
    Ok((Sealer(to_warren), Opener(to_agent)))
}

/// Warren's side of the handshake: the peer is the agent only if it proves it holds
/// `key`. Returns warren's sealer (warren → agent) and opener (agent → warren).
pub async fn connect<S>(stream: &mut S, key: &AgentKey) -> io::Result<(Sealer, Opener)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut hello = [0u8; 8 + NONCE];
    stream.read_exact(&mut hello).await?;
    if &hello[..8] != MAGIC {
        return Err(invalid("the peer is not a warren agent"));
    }
    let agent: [u8; NONCE] = hello[8..].try_into().expect("sized");
    let warren = random_nonce()?;
    let mut answer = Vec::with_capacity(8 + NONCE + PROOF);
    answer.extend_from_slice(MAGIC);
    answer.extend_from_slice(&warren);
    answer.extend_from_slice(key.proof(CLIENT_PROOF, &agent, &warren).as_bytes());
    stream.write_all(&answer).await?;
    let mut proof = [0u8; PROOF];
    stream.read_exact(&mut proof).await?;
    if key.proof(AGENT_PROOF, &agent, &warren) != blake3::Hash::from_bytes(proof) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the peer is not this sandbox's agent (it does not hold the agent key)",
        ));
    }
    let (to_agent, to_warren) = key.sessions(&agent, &warren);
    Ok((Sealer(to_agent), Opener(to_warren)))
}

/// Reads and opens one frame, blocking. `Ok(None)` on a clean end before a frame.
pub fn read_frame<R: Read>(
    reader: &mut R,
    opener: &mut Opener,
) -> io::Result<Option<(Kind, Vec<u8>)>> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match reader.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = Opener::check_length(header)?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    opener.open(&body).map(Some)
}

/// Reads and opens one frame. `Ok(None)` on a clean end before a frame.
pub async fn read_frame_async<R>(
    reader: &mut R,
    opener: &mut Opener,
) -> io::Result<Option<(Kind, Vec<u8>)>>
where
    R: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match reader.read(&mut header[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let len = Opener::check_length(header)?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await?;
    opener.open(&body).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(
        key_agent: &AgentKey,
        key_warren: &AgentKey,
    ) -> io::Result<((Sealer, Opener), (Sealer, Opener))> {
        let (mut a, b) = std::os::unix::net::UnixStream::pair()?;
        let agent_key = key_agent.clone();
        let agent = std::thread::spawn(move || accept(&mut a, &agent_key));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        b.set_nonblocking(true)?;
        let warren = runtime.block_on(async {
            let mut b = tokio::net::UnixStream::from_std(b)?;
            connect(&mut b, key_warren).await
        });
        let agent = agent.join().expect("agent thread");
        Ok((agent?, warren?))
    }

    #[test]
    fn both_sides_holding_the_key_talk_both_ways() {
        let key = AgentKey::generate().unwrap();
        let ((mut agent_seal, mut agent_open), (mut warren_seal, mut warren_open)) =
            pair(&key, &key).unwrap();
        for round in 0..3 {
            let frame = warren_seal
                .seal(Kind::Request, b"{\"type\":\"ping\"}")
                .unwrap();
            let (kind, payload) = agent_open.open(&frame[4..]).unwrap();
            assert_eq!(
                (kind, payload.as_slice()),
                (Kind::Request, &b"{\"type\":\"ping\"}"[..]),
                "{round}"
            );
            let frame = agent_seal.seal(Kind::Stdout, b"out").unwrap();
            assert_eq!(
                warren_open.open(&frame[4..]).unwrap(),
                (Kind::Stdout, b"out".to_vec())
            );
        }
    }

    #[test]
    fn a_peer_without_the_key_is_refused_by_the_agent_and_the_agent_by_warren() {
        let key = AgentKey::generate().unwrap();
        let other = AgentKey::generate().unwrap();
        let Err(error) = pair(&key, &other) else {
            panic!("a wrong key authenticated");
        };
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn a_replayed_altered_or_reordered_frame_fails_to_open() {
        let key = AgentKey::generate().unwrap();
        let (_, (mut seal, _)) = pair(&key, &key).unwrap();
        let ((_, mut open), _) = pair(&key, &key).unwrap();
        // A frame of another connection (another pair of nonces).
        let foreign = seal.seal(Kind::Request, b"x").unwrap();
        assert!(open.open(&foreign[4..]).is_err());

        let ((_, mut open), (mut seal, _)) = pair(&key, &key).unwrap();
        let first = seal.seal(Kind::Request, b"one").unwrap();
        let second = seal.seal(Kind::Request, b"two").unwrap();
        // Out of order.
        assert!(open.open(&second[4..]).is_err());
        let ((_, mut open), (mut seal, _)) = pair(&key, &key).unwrap();
        let first_again = seal.seal(Kind::Request, b"one").unwrap();
        open.open(&first_again[4..]).unwrap();
        // Replayed.
        assert!(open.open(&first_again[4..]).is_err());
        // Altered.
        let ((_, mut open), (mut seal, _)) = pair(&key, &key).unwrap();
        let mut altered = seal.seal(Kind::Request, b"one").unwrap();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert!(open.open(&altered[4..]).is_err());
        drop(first);
    }

    #[test]
    fn an_oversized_length_is_refused_before_its_body_is_read() {
        assert!(Opener::check_length(((MAX_SEALED + 1) as u32).to_le_bytes()).is_err());
        assert!(Opener::check_length(u32::MAX.to_le_bytes()).is_err());
        assert!(Opener::check_length(3u32.to_le_bytes()).is_err());
        assert!(Opener::check_length((MAX_SEALED as u32).to_le_bytes()).is_ok());
    }

    #[test]
    fn keys_are_derived_per_runtime_and_travel_as_hex() {
        let a = AgentKey::derive(b"secret", "sbx-1", 1);
        assert_eq!(a, AgentKey::derive(b"secret", "sbx-1", 1));
        assert_ne!(a, AgentKey::derive(b"secret", "sbx-1", 2));
        assert_ne!(a, AgentKey::derive(b"secret", "sbx-2", 1));
        assert_ne!(a, AgentKey::derive(b"secreT", "sbx-1", 1));
        assert_eq!(AgentKey::from_hex(&a.to_hex()), Some(a.clone()));
        assert_eq!(AgentKey::from_hex("zz"), None);
        assert_eq!(format!("{a:?}"), "AgentKey(..)");
    }
}
