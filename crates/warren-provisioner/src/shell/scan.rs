//! Reading a session's output stream: the bootstrap's ready line, the begin and end
//! markers around each command (found even when split across chunks), and the bounded
//! capture of what lies between them.

use super::*;

/// The bootstrap's ready line: `\x1eR<nonce>\x1f<flavor>` ending in NUL.
pub(super) fn parse_ready(early: &[u8], token: &[u8]) -> Option<Flavor> {
    let at = find(early, token)?;
    let rest = &early[at + token.len()..];
    let end = rest.iter().position(|&b| b == 0)?;
    Some(match rest[..end].strip_prefix(b"\x1f")? {
        b"bash" => Flavor::Bash,
        _ => Flavor::Sh,
    })
}

/// When a command began, from its begin marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BeginMark {
    /// The runtime's clock, in hundredths of a second since boot.
    pub(super) centis: u64,
    /// The last pid the runtime had handed out.
    pub(super) last_pid: Option<i32>,
}

/// The begin marker's trailer: `\x1f<uptime>\x1f<last pid>`.
pub(super) fn parse_begin(trailer: &[u8]) -> Option<BeginMark> {
    let text = std::str::from_utf8(trailer).ok()?.strip_prefix('\x1f')?;
    let (uptime, last_pid) = text.split_once('\x1f').unwrap_or((text, ""));
    Some(BeginMark {
        centis: parse_uptime(uptime)?,
        // gVisor's `/proc/loadavg` says 0: no pid was ever 0, so that tells nothing.
        last_pid: last_pid.parse().ok().filter(|&pid| pid > 0),
    })
}

/// `12345.67` (seconds since boot) as hundredths.
pub(super) fn parse_uptime(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, "0"));
    let mut hundredths: String = fraction.chars().take(2).collect();
    while hundredths.len() < 2 {
        hundredths.push('0');
    }
    Some(whole.parse::<u64>().ok()? * 100 + hundredths.parse::<u64>().ok()?)
}

/// Where `token` first occurs in `haystack`. Tokens start with [`MARK`], which output
/// rarely holds, so only those positions are compared.
pub(super) fn find(haystack: &[u8], token: &[u8]) -> Option<usize> {
    let first = *token.first()?;
    let mut from = 0;
    while let Some(offset) = haystack[from..].iter().position(|&b| b == first) {
        let at = from + offset;
        if haystack[at..].starts_with(token) {
            return Some(at);
        }
        if haystack.len() - at < token.len() {
            return None;
        }
        from = at + 1;
    }
    None
}

/// How many bytes at the end of `data` could be the start of `token` (held back, so a
/// marker split between two chunks is still found).
pub(super) fn partial_suffix(data: &[u8], token: &[u8]) -> usize {
    let longest = token.len().saturating_sub(1).min(data.len());
    (1..=longest)
        .rev()
        .find(|&k| data[data.len() - k..] == token[..k])
        .unwrap_or(0)
}

/// Where one output stream is relative to the current command's markers.
#[derive(Debug, Default)]
pub(super) struct Scan {
    pub(super) phase: Phase,
    /// Bytes kept for the next chunk: a possible marker start, or a trailer in progress.
    pub(super) held: Vec<u8>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// No command: everything is dropped.
    #[default]
    Idle,
    /// Before the begin marker: late output of earlier commands, dropped.
    Begin,
    BeginTrailer,
    /// The command's output.
    Output,
    EndTrailer,
    /// After the end marker: dropped until the next command.
    Done,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Event {
    Output(Vec<u8>),
    Begun(Vec<u8>),
    Ended(Vec<u8>),
}

impl Scan {
    /// A command was handed to the shell: look for its begin marker.
    pub(super) fn expect(&mut self) {
        self.phase = Phase::Begin;
        self.held.clear();
    }

    pub(super) fn feed(&mut self, bytes: &[u8], begin: &[u8], end: &[u8], events: &mut Vec<Event>) {
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            let rest = &data[at..];
            match self.phase {
                Phase::Idle | Phase::Done => return,
                Phase::Begin => match find(rest, begin) {
                    Some(pos) => {
                        at += pos + begin.len();
                        self.phase = Phase::BeginTrailer;
                    }
                    None => {
                        self.held = rest[rest.len() - partial_suffix(rest, begin)..].to_vec();
                        return;
                    }
                },
                Phase::BeginTrailer => match rest.iter().position(|&b| b == 0) {
                    Some(pos) => {
                        events.push(Event::Begun(rest[..pos].to_vec()));
                        at += pos + 1;
                        self.phase = Phase::Output;
                    }
                    None if rest.len() > MAX_TRAILER => {
                        events.push(Event::Begun(Vec::new()));
                        self.phase = Phase::Output;
                        return;
                    }
                    None => {
                        self.held = rest.to_vec();
                        return;
                    }
                },
                Phase::Output => match find(rest, end) {
                    Some(pos) => {
                        if pos > 0 {
                            events.push(Event::Output(rest[..pos].to_vec()));
                        }
                        at += pos + end.len();
                        self.phase = Phase::EndTrailer;
                    }
                    None => {
                        let emit = rest.len() - partial_suffix(rest, end);
                        if emit > 0 {
                            events.push(Event::Output(rest[..emit].to_vec()));
                        }
                        self.held = rest[emit..].to_vec();
                        return;
                    }
                },
                Phase::EndTrailer => match rest.iter().position(|&b| b == 0) {
                    Some(pos) => {
                        events.push(Event::Ended(rest[..pos].to_vec()));
                        self.phase = Phase::Done;
                        return;
                    }
                    None if rest.len() > MAX_TRAILER => {
                        events.push(Event::Ended(Vec::new()));
                        self.phase = Phase::Done;
                        return;
                    }
                    None => {
                        self.held = rest.to_vec();
                        return;
                    }
                },
            }
        }
    }
}

/// One stream of a command's output, masked (I13) and bounded: the first and the last half
/// of `cap` bytes are kept, the middle of a longer output is left out (the end of an
/// output, where a summary or a status line is, matters as much as its start).
pub(super) struct Capture {
    pub(super) masking: MaskingStream,
    pub(super) head: Vec<u8>,
    pub(super) tail: VecDeque<u8>,
    pub(super) half: usize,
    pub(super) omitted: u64,
}

impl Capture {
    pub(super) fn new(cap: usize, masker: &SecretMasker) -> Self {
        Self {
            masking: masker.stream(),
            head: Vec::new(),
            tail: VecDeque::new(),
            half: (cap / 2).max(1),
            omitted: 0,
        }
    }

    pub(super) fn push(&mut self, raw: &[u8]) {
        let masked = self.masking.push(raw);
        self.keep(&masked);
    }

    pub(super) fn finish(&mut self) {
        let held = self.masking.finish();
        self.keep(&held);
    }

    pub(super) fn keep(&mut self, mut bytes: &[u8]) {
        let room = self.half - self.head.len().min(self.half);
        let into_head = bytes.len().min(room);
        self.head.extend_from_slice(&bytes[..into_head]);
        bytes = &bytes[into_head..];
        if bytes.len() > self.half {
            // Only the last `half` bytes can stay.
            self.omitted += (self.tail.len() + bytes.len() - self.half) as u64;
            self.tail.clear();
            bytes = &bytes[bytes.len() - self.half..];
        }
        self.tail.extend(bytes);
        if self.tail.len() > self.half {
            let over = self.tail.len() - self.half;
            self.tail.drain(..over);
            self.omitted += over as u64;
        }
    }

    pub(super) fn truncated(&self) -> bool {
        self.omitted > 0
    }

    pub(super) fn text(&self) -> String {
        let mut bytes = self.head.clone();
        if self.omitted > 0 {
            bytes.extend_from_slice(
                format!("\n[warren: {} bytes of output left out]\n", self.omitted).as_bytes(),
            );
        }
        bytes.extend(self.tail.iter());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
