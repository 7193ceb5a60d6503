//! Finds the wrapper's marker line at the head of a process's stdout, across chunk
//! boundaries, and hands back what follows it.
//!
//! The wrapper prints the marker before the command runs, so it is the first thing on
//! stdout; anything else there first means the wrapper did not run as written, and the
//! process is refused rather than trusted.

use super::wrapper::MARKER_TAG;

/// Longest marker line accepted (`<tag><nonce> <pid> <keeper>\n` is far shorter).
const MAX_MARKER: usize = 256;

/// What the marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marker {
    /// The wrapper's pid in the runtime: the process's pid and process group.
    pub(crate) pid: u32,
    /// The pid of the process holding the FIFO's write end, when there is a FIFO.
    pub(crate) keeper: Option<u32>,
}

/// Why the head of stdout is not a marker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MarkerError {
    /// Something else came first.
    #[error("the process wrapper printed something other than its marker first")]
    Unexpected,
    /// The marker line does not parse.
    #[error("the process wrapper's marker line is malformed")]
    Malformed,
}

/// Scans the head of stdout for the marker.
pub(crate) struct MarkerScanner {
    /// `<tag><nonce> `: what the line must start with.
    prefix: Vec<u8>,
    /// Bytes seen so far.
    seen: Vec<u8>,
}

impl MarkerScanner {
    /// A scanner for the wrapper started with this nonce.
    pub(crate) fn new(nonce: &str) -> Self {
        Self {
            prefix: format!("{MARKER_TAG}{nonce} ").into_bytes(),
            seen: Vec::new(),
        }
    }

    /// Takes the next stdout chunk: `None` while the marker is incomplete, else the marker
    /// and the bytes after its line (the command's first output).
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<Option<(Marker, Vec<u8>)>, MarkerError> {
        self.seen.extend_from_slice(chunk);
        let common = self.seen.len().min(self.prefix.len());
        if self.seen[..common] != self.prefix[..common] {
            return Err(MarkerError::Unexpected);
        }
        if self.seen.len() < self.prefix.len() {
            return Ok(None);
        }
        let Some(newline) = self.seen.iter().position(|&b| b == b'\n') else {
            return if self.seen.len() > MAX_MARKER {
                Err(MarkerError::Malformed)
            } else {
                Ok(None)
            };
        };
        if newline > MAX_MARKER {
            return Err(MarkerError::Malformed);
        }
        let fields = std::str::from_utf8(&self.seen[self.prefix.len()..newline])
            .map_err(|_| MarkerError::Malformed)?;
        let mut fields = fields.split(' ');
        let pid = fields
            .next()
            .and_then(|pid| pid.parse::<u32>().ok())
            .filter(|&pid| pid > 0)
            .ok_or(MarkerError::Malformed)?;
        let keeper = match fields.next() {
            Some("-") => None,
            Some(keeper) => Some(keeper.parse::<u32>().map_err(|_| MarkerError::Malformed)?),
            None => return Err(MarkerError::Malformed),
        };
        if fields.next().is_some() {
            return Err(MarkerError::Malformed);
        }
        let rest = self.seen.split_off(newline + 1);
        self.seen.clear();
        Ok(Some((Marker { pid, keeper }, rest)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(nonce: &str, tail: &str) -> Vec<u8> {
        format!("{MARKER_TAG}{nonce} {tail}").into_bytes()
    }

    #[test]
    fn finds_the_marker_split_at_every_byte() {
        let mut whole = line("n0", "4242 4243\n");
        whole.extend_from_slice(b"hello");
        for cut in 0..whole.len() {
            let mut scanner = MarkerScanner::new("n0");
            let first = scanner.feed(&whole[..cut]).expect("a prefix is fine");
            let (marker, rest) = match first {
                Some(found) => found,
                None => scanner
                    .feed(&whole[cut..])
                    .expect("valid")
                    .expect("complete"),
            };
            assert_eq!(
                marker,
                Marker {
                    pid: 4242,
                    keeper: Some(4243)
                }
            );
            let mut output = rest;
            if first_was_early(cut, &whole) {
                // Found in the first chunk: the second chunk is plain output.
                output.extend_from_slice(&whole[cut..]);
            }
            assert_eq!(output, b"hello", "cut at {cut}");
        }
    }

    /// Whether a cut this late already held the whole marker line.
    fn first_was_early(cut: usize, whole: &[u8]) -> bool {
        let end = whole.iter().position(|&b| b == b'\n').expect("newline") + 1;
        cut >= end
    }

    #[test]
    fn one_byte_at_a_time() {
        let mut whole = line("n1", "7 -\n");
        whole.extend_from_slice(b"x");
        let mut scanner = MarkerScanner::new("n1");
        let mut found = None;
        for (i, byte) in whole.iter().enumerate() {
            if let Some(hit) = scanner.feed(&[*byte]).expect("valid") {
                found = Some((i, hit));
                break;
            }
        }
        let (at, (marker, rest)) = found.expect("found");
        assert_eq!(at, whole.len() - 2);
        assert_eq!(
            marker,
            Marker {
                pid: 7,
                keeper: None
            }
        );
        assert!(rest.is_empty());
    }

    #[test]
    fn refuses_anything_else_first() {
        assert_eq!(
            MarkerScanner::new("n2").feed(b"hello"),
            Err(MarkerError::Unexpected)
        );
        // Another nonce is someone else's marker.
        assert_eq!(
            MarkerScanner::new("n2").feed(&line("n3", "1 -\n")),
            Err(MarkerError::Unexpected)
        );
        for bad in ["x -\n", "0 -\n", "1\n", "1 2 3\n", "1 y\n", "-1 -\n"] {
            assert_eq!(
                MarkerScanner::new("n2").feed(&line("n2", bad)),
                Err(MarkerError::Malformed),
                "{bad:?}"
            );
        }
        let mut endless = line("n2", "1");
        endless.extend(std::iter::repeat_n(b'1', 300));
        assert_eq!(
            MarkerScanner::new("n2").feed(&endless),
            Err(MarkerError::Malformed)
        );
    }
}
